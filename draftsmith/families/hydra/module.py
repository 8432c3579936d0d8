"""``HydraModule``: Hydra and Hydra++ heads (``configs/hydra.yaml``, ``configs/hydrapp.yaml``).

Hydra++ is this module with ``prefix_attention: true``, ``num_layers: 4`` and ``distill: true``
(training against the target's distribution): the paper's best recipe.
"""

from __future__ import annotations

import torch

from draftsmith.core.target import TargetOutput
from draftsmith.families.hydra.network import HydraConfig, HydraModel
from draftsmith.layers.heads import HeadsModule
from draftsmith.layers.module import shift


class HydraModule(HeadsModule):
    """Sequentially dependent heads on the target's final hidden state.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        prefix_attention: Hydra++'s decoder layer over the target's hidden states.
        heads: ``HeadsModule``'s arguments (num_heads, num_layers (Hydra++: 4), head_decay, distill (Hydra++: true),
            optim, estimate).
    """

    def __init__(self, target: str, prefix_attention: bool = False, **heads) -> None:
        self.prefix_attention = prefix_attention
        super().__init__(target, **heads)
        self.save_hyperparameters()

    def build_drafter(self) -> HydraModel:
        cfg = HydraConfig.from_target(
            self.target.config, self.target.vocab_size, self.num_heads, self.num_layers, self.prefix_attention
        )
        model = HydraModel(cfg)
        model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
        return model

    def head_logits(self, batch: dict, out: TargetOutput) -> torch.Tensor:
        model = self.drafter
        base = model.contextualize(out.features[0], batch["attention_mask"])
        embeds = model.embed_tokens(batch["input_ids"])  # (B, T, H)
        # anchor t's head i reads x_{t+1} .. x_{t+1+i}
        shifted = [shift(embeds, s) for s in range(1, self.num_heads + 1)]
        return torch.stack([model.head(i, base, torch.stack(shifted[: i + 1], dim=-2)) for i in range(self.num_heads)])
