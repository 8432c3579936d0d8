"""``CloverModule``: Clover's heads, trained teacher-forced (``configs/clover.yaml``).

Depth i's state at anchor t is unrolled from depth i-1's state at t and the real token x_{t+1+i}: in any
round that reaches depth i the drafts before it equal the real tokens, so the logits (and ``val/tau_est``
on greedy data) are exactly what drafting computes. ``distill: true`` (the recipe's) trains against the
target's distribution at each predicted position.
"""

from __future__ import annotations

import torch

from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.clover.network import CloverConfig, CloverModel
from draftsmith.layers.heads import HeadsModule


class CloverModule(HeadsModule):
    """Clover: augmenting block, attention decoder and regressive heads on the target's final hidden state.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        num_heads: draft depths, one head each.
        num_layers: residual blocks per head.
        heads: ``HeadsModule``'s other arguments (head_decay, distill, optim, estimate).
    """

    def __init__(self, target: str, num_heads: int = 4, num_layers: int = 1, **heads) -> None:
        if num_heads < 1:
            raise DraftsmithError(f"model.num_heads must be at least 1, got {num_heads}")
        if num_layers < 0:
            raise DraftsmithError(f"model.num_layers must be at least 0, got {num_layers}")
        super().__init__(target, num_heads, num_layers, **heads)
        self.save_hyperparameters()

    def build_drafter(self) -> CloverModel:
        cfg = CloverConfig.from_target(self.target.config, self.target.vocab_size, self.num_heads, self.num_layers)
        model = CloverModel(cfg)
        model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
        return model

    def head_logits(self, batch: dict, out: TargetOutput) -> torch.Tensor:
        return self.drafter.unroll(out.features[0], batch["input_ids"], batch["attention_mask"])
