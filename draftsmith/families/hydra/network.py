"""Hydra and Hydra++ heads (Ankner et al. 2024): sequentially dependent draft heads.

Like Medusa, head i (0-based) predicts x_{t+2+i} from the target's final hidden state f_t; unlike
Medusa it also reads the embeddings of every token between: the last committed token x_{t+1}
and the drafts d_1..d_i before it. Its input concat(f_t, E(x_{t+1}), E(d_1), .., E(d_i)) goes
through a linear projection to H, residual SiLU blocks and its own LM head (initialised from
the target's).

Hydra++ (the paper's best recipe) adds a *prefix-attention* layer: one causal decoder layer
over the sequence of the target's hidden states, whose output replaces f_t (so the heads see
context beyond one position); more MLP depth; and training against the target's distribution
(teacher distillation) instead of the data tokens (see ``train/hydra.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.target import TargetOutput
from draftsmith.families.registry import register
from draftsmith.layers.attention import sees_itself
from draftsmith.layers.decoder import PrefixLayer, ResidualBlock
from draftsmith.layers.shape import LayerShape, borrowed_shape
from draftsmith.layers.tree_draft import FeatureState, TreeDrafter


@dataclass
class HydraConfig:
    """Shape of a Hydra drafter. Target-derived fields are filled by the training module."""

    num_heads: int = 4
    num_layers: int = 1
    """Residual blocks per head (Hydra++: 4)."""
    prefix_attention: bool = False
    """Hydra++'s decoder layer over the target's hidden states."""
    shape: LayerShape = LayerShape()
    """The heads' width and the prefix layer's shape, the target's (``borrowed_shape``)."""
    vocab_size: int = 0

    @classmethod
    def from_target(
        cls, target_config, vocab_size: int, num_heads: int, num_layers: int = 1, prefix_attention: bool = False
    ) -> HydraConfig:
        """The Hydra drafter of a target with this HF config (any family: ``borrowed_shape``)."""
        shape = borrowed_shape(target_config, "Hydra++" if prefix_attention else "Hydra")
        return cls(num_heads, num_layers, prefix_attention, shape, vocab_size)


@register("hydra", "hydrapp", config=HydraConfig)
class HydraModel(DrafterNetwork):
    """Frozen target embedding copy, optional prefix layer, and per head: ``proj``, ``blocks``, ``lm_heads``."""

    def __init__(self, cfg: HydraConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, v = cfg.shape.hidden_size, cfg.vocab_size
        self.embed_tokens = nn.Embedding(v, h).requires_grad_(False)
        self.prefix = PrefixLayer(cfg.shape.llama_config(cfg.vocab_size)) if cfg.prefix_attention else None
        self.proj = nn.ModuleList(nn.Linear(h * (i + 2), h) for i in range(cfg.num_heads))
        self.blocks = nn.ModuleList(ResidualBlock(h, cfg.num_layers) for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(cfg.num_heads))
        with torch.no_grad():  # start from f_t alone: proj = [I, 0, ..], so each head starts as Medusa's
            for proj in self.proj:
                proj.weight.zero_()
                proj.weight[:, :h] = torch.eye(h)
                proj.bias.zero_()

    @property
    def method(self) -> str:
        return "hydrapp" if self.cfg.prefix_attention else "hydra"

    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            for head in self.lm_heads:
                head.weight.copy_(lm_head)

    def contextualize(self, features: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Training: (B, T, H) target features -> the heads' base state (Hydra++: through the prefix layer)."""
        features = features.to(self.proj[0].weight.dtype)
        if self.prefix is None:
            return features
        b, t, _ = features.shape
        mask = torch.ones(t, t, dtype=torch.bool, device=features.device).tril()[None, None]
        if valid is not None:
            mask = sees_itself(mask & valid[:, None, None, :].bool())
        positions = torch.arange(t, device=features.device).expand(b, t)
        return self.prefix(features, positions, None, None, mask)[0]

    def head(self, i: int, base: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Head i's logits: base (.., H) and embeds (.., i+1, H) of x_{t+1}, d_1..d_i -> (.., V)."""
        x = torch.cat([base, embeds.flatten(-2)], dim=-1)
        return self.lm_heads[i](self.blocks[i](self.proj[i](x)))

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> HydraDrafter:
        return HydraDrafter(self, topk_accuracy)


class HydraDrafter(TreeDrafter):
    """Drafting with Hydra heads: each depth's head reads the path drafted so far."""

    needs_features = True
    feature_layers = (-1,)

    def __init__(self, model: HydraModel, topk_accuracy: list[list[float]] | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.cfg.vocab_size
        self.max_depth = model.cfg.num_heads
        self.topk_accuracy = topk_accuracy

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> FeatureState:
        return FeatureState(tokens.tolist(), target_out.features[0])

    def advance(self, state: FeatureState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.commit(tokens, target_out.features[0])

    def _base(self, state: FeatureState) -> torch.Tensor:
        """(H,) the heads' base state at the last row; Hydra++ runs the pending rows through its prefix layer."""
        model = self.model
        if model.prefix is None:
            return state.features[-1].to(model.proj[0].weight.dtype)
        start, end = state.cached, len(state.features)
        device = state.features.device
        rows = state.features[None, start:end].to(model.proj[0].weight.dtype)
        mask = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
        positions = torch.arange(start, end, device=device)[None]
        out, k, v = model.prefix(rows, positions, state.past_k, state.past_v, mask[None, None])
        state.past_k = k if state.past_k is None else torch.cat([state.past_k, k], dim=2)
        state.past_v = v if state.past_v is None else torch.cat([state.past_v, v], dim=2)
        return out[0, -1]

    @torch.no_grad()
    def root(self, state: FeatureState) -> tuple[torch.Tensor, torch.Tensor]:
        base = self._base(state)
        last = self.model.embed_tokens(torch.tensor([state.tokens[-1]], device=base.device))  # (1, H)
        return base, self.model.head(0, base, last).float()

    @torch.no_grad()
    def grow(self, state: FeatureState, base: torch.Tensor, tokens, parents, new) -> torch.Tensor:
        paths = []
        for n in new:
            path, p = [], n
            while p >= 0:
                path.append(tokens[p])
                p = parents[p]
            paths.append([state.tokens[-1], *reversed(path)])
        ids = torch.tensor(paths, device=base.device)  # (F, depth + 1)
        return self.model.head(ids.shape[1] - 1, base.expand(len(new), -1), self.model.embed_tokens(ids)).float()
