"""Clover (Xiao et al. 2024): regressive heads with sequential knowledge, on the target's final hidden state.

Like Medusa and Hydra, depth i (0-based) from anchor t predicts x_{t+2+i}. Clover adds:

- an **augmenting block**: one causal decoder layer over the target's final hidden states f_0..f_t
  (``layers.decoder.PrefixLayer``, Hydra++'s prefix layer), giving augmented states h'_0..h'_t;
- an **attention decoder**, shared by every depth: a query from the draft state and the previous
  token's embedding, x_i = fc(concat(s_i, norm(E(token_i)))), attends (cross-attention, RoPE) over
  h'_0..h'_t, and s_{i+1} = x_i + o_proj(attention) is the new draft state;
- the **regressive connection**: s_0 = h'_t and s_{i+1} feeds depth i+1, so every depth conditions on
  all the tokens drafted before it. token_0 is the last committed token x_{t+1}; token_i the draft d_i.

Depth i's head is a residual SiLU block (Medusa's) and its own LM head (a copy of the target's) on
s_{i+1}. Everything starts as the identity (fc = [I, 0], zero o_proj / down_proj / blocks), so an
untrained Clover drafts as an untrained Medusa. While drafting, the keys/values of the augmenting
block and those of the decoder's cross-attention over h' are cached for the committed rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import register
from draftsmith.layers.attention import sees_itself
from draftsmith.layers.decoder import PrefixLayer, ResidualBlock
from draftsmith.layers.shape import LayerShape, borrowed_shape
from draftsmith.layers.tree_draft import FeatureState, TreeDrafter


@dataclass
class CloverConfig:
    """Shape of a Clover drafter. Target-derived fields are filled by ``from_target``."""

    num_heads: int = 4
    """Draft depths (one head each)."""
    num_layers: int = 1
    """Residual blocks per head."""
    shape: LayerShape = LayerShape()
    """The heads' width and the augmenting block's shape, the target's (``borrowed_shape``)."""
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_layers < 0:
            raise DraftsmithError(
                f"clover: num_heads must be at least 1 and num_layers at least 0, got {self.num_heads} "
                f"and {self.num_layers}"
            )

    @classmethod
    def from_target(cls, target_config, vocab_size: int, num_heads: int, num_layers: int = 1) -> CloverConfig:
        """The Clover drafter of a target with this HF config (any family: ``borrowed_shape``)."""
        return cls(num_heads, num_layers, borrowed_shape(target_config, "Clover"), vocab_size)


class AttentionDecoder(nn.Module):
    """Clover's attention decoder: draft state + previous token -> query; cross-attention over h' -> next state."""

    def __init__(self, cfg: CloverConfig) -> None:
        super().__init__()
        h, inner = cfg.shape.hidden_size, cfg.shape.num_attention_heads * cfg.shape.head_dim
        self.num_heads, self.head_dim = cfg.shape.num_attention_heads, cfg.shape.head_dim
        self.token_norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)  # embeddings are far smaller than hidden states
        self.fc = nn.Linear(2 * h, h)
        self.query_norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.memory_norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.q_proj = nn.Linear(h, inner, bias=False)
        self.k_proj = nn.Linear(h, inner, bias=False)
        self.v_proj = nn.Linear(h, inner, bias=False)
        self.o_proj = nn.Linear(inner, h, bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg.shape.llama_config(cfg.vocab_size))
        with torch.no_grad():  # start as the identity: s_{i+1} = s_i
            self.fc.weight.zero_()
            self.fc.weight[:, :h] = torch.eye(h)
            self.fc.bias.zero_()
            self.o_proj.weight.zero_()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)

    def _rope(self, x: torch.Tensor, like: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, nh, T, hd) rotated to positions (B, T)."""
        cos, sin = self.rotary(like, positions)  # (B, T, hd)
        return x * cos[:, None] + rotate_half(x) * sin[:, None]

    def memory(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, nh, S, hd) of augmented states h' (B, S, H) at positions (B, S)."""
        hidden = self.memory_norm(hidden)
        k, v = self._heads(self.k_proj(hidden)), self._heads(self.v_proj(hidden))
        return self._rope(k, hidden, positions), v

    def forward(self, state, embeds, positions, keys, values, mask) -> torch.Tensor:
        """state, embeds (B, T, H) at query positions (B, T); keys/values (B, nh, S, hd); mask (B|1, 1, T, S)
        bool, True = attend -> the next draft state (B, T, H)."""
        x = self.fc(torch.cat([state, self.token_norm(embeds)], dim=-1))
        query = self.query_norm(x)
        q = self._rope(self._heads(self.q_proj(query)), query, positions)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, nh, T, hd)
        return x + self.o_proj(out.transpose(1, 2).flatten(2))


@register("clover", config=CloverConfig)
class CloverModel(DrafterNetwork):
    """Frozen target embedding copy, ``block`` (augmenting), ``decoder`` (attention decoder), and per head:
    ``blocks`` and ``lm_heads``."""

    method = "clover"

    def __init__(self, cfg: CloverConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, v = cfg.shape.hidden_size, cfg.vocab_size
        self.embed_tokens = nn.Embedding(v, h).requires_grad_(False)
        self.block = PrefixLayer(cfg.shape.llama_config(cfg.vocab_size))
        self.decoder = AttentionDecoder(cfg)
        self.blocks = nn.ModuleList(ResidualBlock(h, cfg.num_layers) for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(cfg.num_heads))

    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            for head in self.lm_heads:
                head.weight.copy_(lm_head)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.fc.weight.dtype

    def augment(self, features, positions, past_k, past_v, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The augmenting block: target features (B, T, H) -> h' (B, T, H), and its new keys/values."""
        return self.block(features.to(self.dtype), positions, past_k, past_v, mask)

    def head(self, i: int, state: torch.Tensor) -> torch.Tensor:
        """Depth i's logits (.., V) from its draft state s_{i+1} (.., H)."""
        return self.lm_heads[i](self.blocks[i](state))

    def unroll(
        self, features: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Training, teacher-forced: (B, T, H) target features and (B, T) tokens -> (num_heads, B, T, V).

        Anchor t's depth i reads x_{t+1+i} and attends over h'_0..h'_t (every anchor of a depth in one call).
        """
        from draftsmith.layers.module import shift  # training's: drafting imports no Lightning

        b, t, _ = features.shape
        device = features.device
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, T, T): key <= anchor
        mask = causal if valid is None else sees_itself(causal & valid[:, None, None, :].bool())
        positions = torch.arange(t, device=device).expand(b, t)
        hidden = self.augment(features, positions, None, None, mask)[0]
        keys, values = self.decoder.memory(hidden, positions)
        embeds = self.embed_tokens(input_ids)  # (B, T, H)
        state, logits = hidden, []
        for i in range(self.cfg.num_heads):
            state = self.decoder(state, shift(embeds, 1 + i), positions + 1 + i, keys, values, mask)  # x_{t+1+i}
            logits.append(self.head(i, state))
        return torch.stack(logits)

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> CloverDrafter:
        return CloverDrafter(self, topk_accuracy)


@dataclass
class CloverState(FeatureState):
    """``FeatureState`` plus the attention decoder's keys/values of the committed rows' augmented states."""

    memory_k: torch.Tensor | None = None
    memory_v: torch.Tensor | None = None
    """(1, nh, rows, hd): what every depth's cross-attention reads."""


@dataclass
class CloverRound:
    """One drafting round's scratch: the anchor, and the draft state each node's children are drafted from."""

    anchor: int
    root: torch.Tensor
    """(H,) s_1: the state the first drafted token came from."""
    states: dict[int, torch.Tensor]
    """node -> (H,) the state its child is drafted from (filled by ``grow``)."""


class CloverDrafter(TreeDrafter):
    """Drafting with Clover: each depth's state comes from its parent's state and token (batched per depth)."""

    needs_features = True
    feature_layers = (-1,)

    def __init__(self, model: CloverModel, topk_accuracy: list[list[float]] | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.cfg.vocab_size
        self.max_depth = model.cfg.num_heads
        self.topk_accuracy = topk_accuracy

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> CloverState:
        return CloverState(tokens.tolist(), target_out.features[0])

    def advance(self, state: CloverState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.commit(tokens, target_out.features[0])

    def _catch_up(self, state: CloverState) -> torch.Tensor:
        """Run the rows not yet seen through the augmenting block and cache both layers' keys/values; (H,) h'_t."""
        model = self.model
        start, end = state.cached, len(state.features)
        device = state.features.device
        mask = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
        positions = torch.arange(start, end, device=device)[None]
        rows = state.features[None, start:end]
        hidden, k, v = model.augment(rows, positions, state.past_k, state.past_v, mask[None, None])
        mk, mv = model.decoder.memory(hidden, positions)
        if state.past_k is None:
            state.past_k, state.past_v, state.memory_k, state.memory_v = k, v, mk, mv
        else:
            state.past_k, state.past_v = torch.cat([state.past_k, k], 2), torch.cat([state.past_v, v], 2)
            state.memory_k, state.memory_v = torch.cat([state.memory_k, mk], 2), torch.cat([state.memory_v, mv], 2)
        return hidden[0, -1]

    def _step(
        self, state: CloverState, anchor: int, depth: int, states: torch.Tensor, tokens: list[int]
    ) -> torch.Tensor:
        """States (F, H) at ``depth`` (0-based) and their tokens -> the next states (F, H)."""
        ids = torch.tensor([tokens], device=states.device)
        positions = torch.full_like(ids, anchor + 1 + depth)
        return self.model.decoder(
            states[None], self.model.embed_tokens(ids), positions, state.memory_k, state.memory_v, None
        )[0]

    @torch.no_grad()
    def root(self, state: CloverState) -> tuple[CloverRound, torch.Tensor]:
        base = self._catch_up(state)
        anchor = len(state.features) - 1
        s1 = self._step(state, anchor, 0, base[None], [state.tokens[-1]])[0]
        return CloverRound(anchor, s1, {}), self.model.head(0, s1).float()

    @torch.no_grad()
    def grow(self, state: CloverState, scratch: CloverRound, tokens, parents, new) -> torch.Tensor:
        depth, p = 0, new[0]
        while p >= 0:  # every node in ``new`` is at one depth
            depth, p = depth + 1, parents[p]
        inputs = torch.stack([scratch.root if parents[n] < 0 else scratch.states[parents[n]] for n in new])  # (F, H)
        out = self._step(state, scratch.anchor, depth, inputs, [tokens[n] for n in new])
        scratch.states.update(zip(new, out, strict=True))
        return self.model.head(depth, out).float()
