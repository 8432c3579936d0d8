"""``MedusaModule``: Medusa-1 (heads on a frozen target) and Medusa-2 (heads + the target's LoRA, jointly).

Recipes: ``configs/medusa1.yaml``, ``configs/medusa2.yaml``.

Medusa-2 keeps the target's quality with self-distillation: its LM loss is KL(original target ||
adapted target) on the training text, where the original is the same network with the LoRA
adapter switched off. For the first ``head_warmup_steps`` only the heads train (on the frozen
target's features), as the paper recommends, so that untrained heads do not drag the target.
``val/target_nll`` (the adapted target's loss on the held-out text) and ``val/target_kl``
report what the fine-tuning cost; at step 0 they are the original target's.
"""

from __future__ import annotations

import torch

from draftsmith.core.target import TargetOutput
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.layers.heads import HeadsModule
from draftsmith.layers.lora import Lora
from draftsmith.layers.losses import forward_kl, masked_mean
from draftsmith.layers.module import read_init


class MedusaModule(HeadsModule):
    """Medusa heads on the target's final hidden state.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        lora: Medusa-2: fine-tune the target with this LoRA adapter; None for Medusa-1.
        lm_weight: Medusa-2: weight of the target's self-distillation loss.
        head_warmup_steps: Medusa-2: steps that train only the heads before joint training.
        init: Medusa-1 heads (a checkpoint or native dir, e.g. one ``draftsmith import`` made of the Medusa
            repository's or vLLM's layout) to go on from, their number and depth with them; None: fresh heads.
        heads: ``HeadsModule``'s arguments (num_heads, num_layers, head_decay, distill, optim, estimate).
    """

    def __init__(
        self,
        target: str,
        lora: Lora | None = None,
        lm_weight: float = 1.0,
        head_warmup_steps: int = 0,
        init: str | None = None,
        **heads,
    ) -> None:
        self.lora, self.init, self._start = lora, init, None
        if init is not None:  # its record decides the heads' number and depth
            self._start = read_init(init, "medusa1")
            heads |= {k: self._start[0]["config"][k] for k in ("num_heads", "num_layers")}
        super().__init__(target, **heads)
        self.save_hyperparameters()
        self.lm_weight, self.head_warmup_steps = lm_weight, head_warmup_steps

    def build_drafter(self) -> MedusaModel:
        lora = {}
        self.peft = None
        if self.lora is not None:
            from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

            spec = self.lora
            config = LoraConfig(**spec.peft_kwargs())
            self.peft = get_peft_model(self.target.model, config)  # adapters injected into target.model in place
            shapes = {k: list(v.shape) for k, v in get_peft_model_state_dict(self.peft).items()}
            lora = {"r": spec.r, "alpha": spec.alpha, "target_modules": list(spec.target_modules), "shapes": shapes}
        cfg = MedusaConfig(self.num_heads, self.num_layers, self.target.hidden_size, self.target.vocab_size, lora)
        model = MedusaModel(cfg)
        model.init_from_target(self.target.lm_head.weight)
        if self._start is not None:
            from draftsmith.core.fingerprint import check_fingerprint

            check_fingerprint(self._start[0]["target"], self.target.fingerprint, f"model.init {self.init!r}")
            model.load_state_dict(self._start[1], strict=not lora)  # Medusa-2: its adapter starts fresh
        return model

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        lora = [p for p in self.peft.parameters() if p.requires_grad] if self.peft is not None else []
        return super().trainable_parameters() + lora

    def _joint(self) -> bool:
        return self.peft is not None and self.training and self.global_step >= self.head_warmup_steps

    def target_forward(self, batch: dict, vocab: torch.Tensor | None = None) -> TargetOutput:
        if not self._joint():
            return super().target_forward(batch, vocab)
        out = self.target.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        )
        return TargetOutput(out.logits.float(), (out.hidden_states[-1],))

    def head_logits(self, batch: dict, out: TargetOutput) -> torch.Tensor:
        return self.drafter(out.features[0])

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        logs = super().losses(batch, out)
        if self.peft is None:
            return logs
        ids, attn = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad(), self.peft.disable_adapter():
            original = self.target.model(input_ids=ids, attention_mask=attn).logits
        logs["target_kl"] = masked_mean(forward_kl(out.logits, original), attn)
        nll = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
        )
        logs["target_nll"] = masked_mean(nll.view_as(ids[:, 1:]), batch["loss_mask"][:, 1:])
        if self._joint():
            logs["loss"] = logs["loss"] + self.lm_weight * logs["target_kl"]
        return logs

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Medusa-2: copy the adapter into the drafter's ``target_lora`` tensors, so it travels with the heads."""
        if self.peft is not None:
            from peft import get_peft_model_state_dict

            self.drafter.store_lora(get_peft_model_state_dict(self.peft))
            for name, tensor in self.drafter.target_lora.state_dict().items():
                checkpoint["state_dict"][f"drafter.target_lora.{name}"] = tensor.clone()
        super().on_save_checkpoint(checkpoint)
