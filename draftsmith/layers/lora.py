"""The one LoRA adapter description (peft), shared by the families that train one (Medusa-2 on the target, draft LMs
on the student)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lora:
    """A peft LoRA adapter."""

    r: int = 8
    """Adapter rank."""
    alpha: int = 16
    """Scale numerator (the update is alpha / r * B A; peft's ``lora_alpha``)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names of the linear layers that get an adapter (default: the attention projections)."""

    def peft_kwargs(self) -> dict:
        return {"r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": list(self.target_modules)}  # fmt: skip
