"""P-EAGLE (arXiv 2602.01469): EAGLE-3's layer drafting all K positions in one forward.

After the pending anchors (each pairing x_{i+1} with the fused target feature f_i, as EAGLE-3), the layer reads
K - 1 placeholders at the positions that follow the last anchor: the embedding of a mask token id paired with
``fc(mask_hidden)``, a learned stand-in for the target features it does not have (vLLM 0.32's parallel EAGLE-3
reads exactly these two: ``pard_token`` and ``mask_hidden`` of the concatenated feature width). Placeholder d's output predicts draft position d + 1; the last anchor's predicts
position 1, as in EAGLE-3. Trained with the parallel objective of ``layers/parallel.py`` (each anchor's chain of
placeholders sees the real context up to the anchor and its own chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.families.eagle.config import Eagle3Config
from draftsmith.families.eagle.network import EagleDrafter, EagleModel
from draftsmith.families.registry import register
from draftsmith.layers.parallel import ParallelDrafter, ParallelLayout
from draftsmith.layers.tree_draft import FeatureState


@dataclass
class PEagleConfig(Eagle3Config):
    """EAGLE-3's shape plus the drafting depth and the placeholder token."""

    depth: int = 4
    """Tokens one forward drafts (the K it was trained for)."""
    mask_token_id: int = 0
    """The placeholder's token id (its embedding is the target's, like every input token's)."""


@register("peagle", config=PEagleConfig)
class PEagleModel(EagleModel):
    """An EAGLE-3 network with a learned placeholder feature (``mask_hidden``, before ``fc``)."""

    method = "peagle"

    def __init__(self, cfg: PEagleConfig) -> None:
        super().__init__(cfg)
        self.mask_hidden = nn.Parameter(torch.zeros(len(cfg.feature_layers) * cfg.target_hidden_size))

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> PEagleDrafter:
        return PEagleDrafter(self, topk_accuracy)

    def run(self, tokens, hidden, placeholders: int, positions, past_k, past_v, mask):
        """The layer over anchors (tokens (B, m) with hidden (B, m, H)) followed by ``placeholders`` placeholder
        rows: (output (B, m + n, H), keys, values)."""
        b = tokens.shape[0]
        masks = torch.full((b, placeholders), self.cfg.mask_token_id, device=tokens.device)
        embeds = self.embed_tokens(torch.cat([tokens, masks], dim=1))
        hidden = torch.cat([hidden, self.fc(self.mask_hidden).expand(b, placeholders, -1)], dim=1)
        cos, sin = self.rotary(hidden, positions)
        return self.layers(embeds, hidden, cos, sin, past_k, past_v, mask)

    def parallel(self, input_ids: torch.Tensor, features: tuple[torch.Tensor, ...], layout: ParallelLayout):
        """Training: every anchor and its placeholder chains in one forward -> (B, Q, H) outputs."""
        t = input_ids.shape[1]
        tokens = F.pad(input_ids, (0, 1), value=0)[:, 1 : t + 1]  # anchor i reads x_{i+1}
        placeholders = layout.mask.shape[-1] - t
        out, _, _ = self.run(tokens, self.fuse(features), placeholders, layout.positions, None, None, layout.mask)
        return out


class PEagleDrafter(ParallelDrafter, EagleDrafter):
    """One layer call per round: the anchors committed since the last round, then k - 1 placeholders."""

    def __init__(self, model: PEagleModel, topk_accuracy: list[list[float]] | None = None) -> None:
        super().__init__(model, topk_accuracy)
        self.max_depth = model.cfg.depth

    @torch.no_grad()
    def block_logits(self, state: FeatureState, k: int) -> torch.Tensor:
        model, device = self.model, state.features.device
        start, end = state.cached, len(state.tokens) - 1
        m, n = end - start, k - 1
        tokens = torch.tensor([state.tokens[start + 1 : end + 1]], device=device)
        positions = torch.cat([torch.arange(start, end), end - 1 + torch.arange(1, n + 1)]).to(device)[None]
        mask = torch.ones(m + n, start + m + n, dtype=torch.bool, device=device).tril(start)
        out, keys, values = model.run(
            tokens, state.features[None, start:end], n, positions, state.past_k, state.past_v, mask[None, None]
        )
        keys, values = keys[:, :, :m], values[:, :, :m]  # the placeholders' keys/values are not kept
        state.past_k = keys if state.past_k is None else torch.cat([state.past_k, keys], dim=2)
        state.past_v = values if state.past_v is None else torch.cat([state.past_v, values], dim=2)
        return self._full_logits(out[0, m - 1 :])
