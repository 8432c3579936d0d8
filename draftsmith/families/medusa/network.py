"""Medusa heads (Cai et al. 2024): K extra decoding heads on the target's last hidden state.

Head i (0-based) reads the target's final hidden state f_t at the position that predicted the
last committed token x_{t+1} and predicts x_{t+2+i}: residual blocks x + SiLU(W x + b), then its
own LM head. The blocks start at zero (identity) and the LM heads as copies of the target's, so
every head starts out predicting what the target's own head predicts.

Medusa-1 trains the heads on a frozen target. Medusa-2 also fine-tunes the target through a
LoRA adapter (peft); the adapter's tensors travel with the heads (``target_lora.*``), and the
drafter then drafts for — and is scored against — the adapted target (``adapt_target``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.target import Target, TargetOutput
from draftsmith.families.registry import register
from draftsmith.layers.decoder import ResidualBlock
from draftsmith.layers.parallel import ParallelDrafter


@dataclass
class MedusaConfig:
    """Shape of a Medusa drafter. ``hidden_size`` / ``vocab_size`` come from the target."""

    num_heads: int = 4
    """Heads, i.e. the deepest draft."""
    num_layers: int = 1
    """Residual blocks per head."""
    hidden_size: int = 0
    vocab_size: int = 0
    lora: dict = field(default_factory=dict)
    """Medusa-2: the target's LoRA adapter ({r, alpha, target_modules, shapes}); empty for Medusa-1."""


def _lora_key(name: str) -> str:
    """peft state-dict name -> a buffer name (buffers may not contain dots)."""
    return name.replace(".", "__")


@register("medusa1", "medusa2", config=MedusaConfig)
class MedusaModel(DrafterNetwork):
    """The heads: ``blocks.i.layers.j`` and ``lm_heads.i``, and Medusa-2's ``target_lora`` tensors."""

    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, v = cfg.hidden_size, cfg.vocab_size
        self.blocks = nn.ModuleList(ResidualBlock(h, cfg.num_layers) for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(cfg.num_heads))
        if cfg.lora:
            self.target_lora = nn.Module()
            for name, shape in cfg.lora["shapes"].items():
                self.target_lora.register_buffer(_lora_key(name), torch.zeros(shape))

    @property
    def method(self) -> str:
        return "medusa2" if self.cfg.lora else "medusa1"

    def init_from_target(self, lm_head: torch.Tensor) -> None:
        with torch.no_grad():
            for head in self.lm_heads:
                head.weight.copy_(lm_head)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) final target hidden states -> (num_heads, ..., V) logits; head i predicts i+2 ahead."""
        hidden = hidden.to(self.lm_heads[0].weight.dtype)
        return torch.stack([head(block(hidden)) for block, head in zip(self.blocks, self.lm_heads, strict=True)])

    def lora_state(self) -> dict[str, torch.Tensor]:
        """The adapter as peft names it."""
        return {name: getattr(self.target_lora, _lora_key(name)) for name in self.cfg.lora.get("shapes", {})}

    def store_lora(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in state.items():
            getattr(self.target_lora, _lora_key(name)).copy_(tensor.detach())

    def adapt_target(self, target: Target) -> Target:
        """Medusa-2: a copy of ``target`` with this drafter's LoRA adapter merged in."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        lora = self.cfg.lora
        config = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"])
        peft_model = get_peft_model(copy.deepcopy(target.model), config)
        set_peft_model_state_dict(peft_model, self.lora_state())
        merged = peft_model.merge_and_unload().eval().requires_grad_(False)
        return Target(merged, target.tokenizer, target.feature_layers, name=f"{target.name}+{self.method}-lora")

    def adapted_target(self, target: Target) -> Target | None:
        return self.adapt_target(target) if self.cfg.lora else None

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> MedusaDrafter:
        return MedusaDrafter(self, topk_accuracy)


@dataclass
class MedusaState:
    feature: torch.Tensor
    """(H,) the target's final hidden state at the position that predicted the last committed token."""


class MedusaDrafter(ParallelDrafter):
    """Drafting with Medusa heads: every depth's distribution comes from one call on one feature."""

    needs_features = True
    feature_layers = (-1,)

    def __init__(self, model: MedusaModel, topk_accuracy: list[list[float]] | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.cfg.vocab_size
        self.max_depth = model.cfg.num_heads
        self.topk_accuracy = topk_accuracy

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> MedusaState:
        return MedusaState(target_out.features[0][-1])

    def advance(self, state: MedusaState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.feature = target_out.features[0][-1]

    @torch.no_grad()
    def block_logits(self, state: MedusaState, k: int) -> torch.Tensor:
        return self.model(state.feature)[:k]  # (k, V): the heads run together anyway
