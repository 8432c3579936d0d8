"""DFlash-style block drafter (z-lab; vLLM 0.32's ``DFlashDraftModel``): a few layers denoise a block of masks.

The target's multi-layer features are fused (``fc``, then ``hidden_norm``) into one context state per committed
position, which enters every layer only as keys/values (``k_norm(k_proj(c))`` with RoPE, ``v_proj(c)``): the
context runs through no layer. The block is the last committed token followed by K masks at the next positions
(a learned ``mask_embedding``, or with ``mask_from_token`` the target's embedding of ``mask_token_id``, frozen, as
speculators' and z-lab's DFlash read them); its queries attend to the whole context and to the whole block
(bidirectional), and mask j's output predicts the token at its own position. One forward drafts K tokens, each
with its own distribution q. Layers are Qwen3-shaped (``q_norm`` / ``k_norm`` per head), the embedding and LM
head are the target's (frozen copies), as vLLM shares them.

Positions: anchor a (layers/estimate.py) has context features f_0..f_a, the committed token x_{a+1} at position
a + 1 and masks at a + 2 .. a + 1 + K; mask d + 1 predicts x_{a+d+2}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import register
from draftsmith.layers.parallel import ParallelDrafter
from draftsmith.layers.shape import LayerShape, borrowed_shape


@dataclass
class DFlashConfig:
    """Shape of a DFlash drafter; target-derived fields are filled by ``from_target``."""

    feature_layers: tuple[int, ...] = (-1,)
    """Target hidden_states indices fused into the context."""
    depth: int = 4
    """Masks per block: tokens one forward drafts (vLLM's ``num_speculative_tokens``; block size depth + 1)."""
    num_layers: int = 1
    """Drafter layers."""
    mask_token_id: int = 0
    """The id engines mark masks with (vLLM replaces its embedding by ``mask_embedding``)."""
    mask_from_token: bool = False
    """The masks' embedding is the target's embedding of ``mask_token_id``, not learned: what speculators' DFlash
    computes (it reloads the embedding from the target and has no mask tensor), so only such a drafter exports there."""
    shape: LayerShape = LayerShape()
    """The drafter layers' shape, the target's (``borrowed_shape``)."""
    vocab_size: int = 0
    target_hidden_size: int = 0
    extra: dict = field(default_factory=dict)

    @staticmethod
    def from_target(target_config, feature_layers: tuple[int, ...], depth: int, num_layers: int) -> DFlashConfig:
        if depth < 1 or num_layers < 1:
            raise DraftsmithError(f"dflash: depth and num_layers must be at least 1, got {depth} and {num_layers}")
        shape = borrowed_shape(target_config, "DFlash")
        return DFlashConfig(
            feature_layers=tuple(feature_layers),
            depth=depth,
            num_layers=num_layers,
            shape=shape,
            vocab_size=target_config.vocab_size,
            target_hidden_size=shape.hidden_size,
        )

    def llama_config(self) -> LlamaConfig:
        """The Llama-shaped config its MLP and rotary embedding are built from (the same fields as EAGLE's layer)."""
        return self.shape.llama_config(self.vocab_size)


class DFlashAttention(nn.Module):
    """Qwen3-style attention whose keys/values are the context's (passed in) followed by the block's own."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        inner = cfg.shape.num_attention_heads * cfg.shape.head_dim
        self.num_heads, self.head_dim = cfg.shape.num_attention_heads, cfg.shape.head_dim
        self.q_proj = nn.Linear(cfg.shape.hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(cfg.shape.hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(cfg.shape.hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.shape.hidden_size, bias=False)
        self.q_norm = LlamaRMSNorm(cfg.shape.head_dim, cfg.shape.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(cfg.shape.head_dim, cfg.shape.rms_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(-3, -2)  # (B, nh, T, hd)

    def context_kv(self, context: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, H) fused context states -> this layer's keys and values (B, nh, S, hd)."""
        k = self.k_norm(self._heads(self.k_proj(context)))
        return apply_rotary_pos_emb(k, k, cos, sin)[0], self._heads(self.v_proj(context))

    def forward(self, x, cos, sin, context_k, context_v, mask):
        """x (B, Q, H) block rows; context_k/v (B, nh, S, hd); mask (B or 1, 1, Q, S + Q) bool or None (all)."""
        q = self.q_norm(self._heads(self.q_proj(x)))
        k = self.k_norm(self._heads(self.k_proj(x)))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys = torch.cat([context_k, k], dim=2)
        values = torch.cat([context_v, self._heads(self.v_proj(x))], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.shape.hidden_size, cfg.shape.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.shape.hidden_size, cfg.shape.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, h, cos, sin, context_k, context_v, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, context_k, context_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


@register("dflash", config=DFlashConfig)
class DFlashModel(DrafterNetwork):
    """The trainable block drafter plus frozen copies of the target's embedding and LM head."""

    method = "dflash"

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.shape.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h).requires_grad_(False)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False).requires_grad_(False)
        self.fc = nn.Linear(len(cfg.feature_layers) * cfg.target_hidden_size, h, bias=False)
        self.hidden_norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(h), requires_grad=not cfg.mask_from_token)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = LlamaRMSNorm(h, cfg.shape.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())

    @property
    def reads_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.feature_layers)

    @property
    def output_size(self) -> int:
        return self.cfg.shape.hidden_size

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> DFlashDrafter:
        return DFlashDrafter(self, topk_accuracy)

    def init_from_target(self, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            self.lm_head.weight.copy_(lm_head)
            self.mask_embedding.copy_(embed.mean(0))  # unused with mask_from_token

    def mask(self) -> torch.Tensor:
        """(H,) the masks' input embedding."""
        if self.cfg.mask_from_token:
            return self.embed_tokens.weight[self.cfg.mask_token_id]
        return self.mask_embedding

    def context(self, features: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Target features (each (.., S, Ht)) -> fused, normed context states (.., S, H)."""
        return self.hidden_norm(self.fc(torch.cat(features, dim=-1).to(self.fc.weight.dtype)))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the context's keys and values at ``positions`` (B, S)."""
        cos, sin = self.rotary(context, positions)
        return [layer.self_attn.context_kv(context, cos, sin) for layer in self.layers]

    def block_hidden(self, tokens: torch.Tensor, depth: int, positions, kv, mask) -> torch.Tensor:
        """Blocks of (the committed token (B, n), then ``depth`` masks) at ``positions`` (B, n * (depth + 1)):
        (B, n, depth, H) normed output states of the mask rows (what the LM head reads)."""
        b, n = tokens.shape
        embeds = torch.cat([self.embed_tokens(tokens)[:, :, None], self.mask().expand(b, n, depth, -1)], 2)
        h = embeds.reshape(b, n * (depth + 1), -1)
        cos, sin = self.rotary(h, positions)
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            h = layer(h, cos, sin, k, v, mask)
        return self.norm(h.view(b, n, depth + 1, -1)[:, :, 1:])

    def block(self, tokens: torch.Tensor, depth: int, positions, kv, mask) -> torch.Tensor:
        """``block_hidden``'s blocks -> (B, n * depth, V) logits of the mask rows, block by block."""
        b, n = tokens.shape
        return self.lm_head(self.block_hidden(tokens, depth, positions, kv, mask)).reshape(b, n * depth, -1)

    def forward(self, input_ids: torch.Tensor, features, valid: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Training: one block per anchor, each seeing the context up to its anchor.

        Args:
            input_ids: (B, T) the sequence.
            features: the target's features at each position, each (B, T, Ht).
            valid: (B, T) 1 on real tokens.
            anchors: (n,) anchors (each < T - 1).

        Returns:
            (B, n, depth, V): anchor a's mask d + 1 predicts x_{a+d+2}.
        """
        return self.lm_head(self.hidden(input_ids, features, valid, anchors))

    def hidden(self, input_ids: torch.Tensor, features, valid: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """``forward``'s blocks before the LM head: (B, n, depth, H) normed output states of each anchor's masks."""
        b, t = input_ids.shape
        depth, device = self.cfg.depth, input_ids.device
        positions = torch.arange(t, device=device).expand(b, t)
        kv = self.context_kv(self.context(features), positions)
        block_pos = (anchors[:, None] + 1 + torch.arange(depth + 1, device=device)).flatten()  # (n * (depth+1),)
        owner = anchors.repeat_interleave(depth + 1)  # each block row's anchor
        sees_context = torch.arange(t, device=device)[None, :] <= owner[:, None]
        same_block = owner[:, None] == owner[None, :]
        mask = torch.cat([sees_context[None] & valid.bool()[:, None, :], same_block.expand(b, -1, -1)], dim=2)
        return self.block_hidden(input_ids[:, anchors + 1], depth, block_pos.expand(b, -1), kv, mask[:, None])


@dataclass
class DFlashState:
    tokens: list[int]
    pending: torch.Tensor
    """(m, H) context states not yet turned into keys/values."""
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def cached(self) -> int:
        return 0 if self.kv is None else self.kv[0][0].shape[2]


class DFlashDrafter(ParallelDrafter):
    """One block forward per round over the cached context keys/values."""

    needs_features = True

    def __init__(self, model: DFlashModel, topk_accuracy: list[list[float]] | None = None) -> None:
        self.model = model.eval()
        self.vocab_size = model.cfg.vocab_size
        self.feature_layers = model.cfg.feature_layers
        self.max_depth = model.cfg.depth
        self.topk_accuracy = topk_accuracy

    @torch.no_grad()
    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> DFlashState:
        return DFlashState(tokens.tolist(), self.model.context(target_out.features))

    @torch.no_grad()
    def advance(self, state: DFlashState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.tokens.extend(tokens.tolist())
        state.pending = torch.cat([state.pending, self.model.context(target_out.features)])

    @torch.no_grad()
    def block_logits(self, state: DFlashState, k: int) -> torch.Tensor:
        return self.model.lm_head(self.block_hidden(state))[:k]

    @torch.no_grad()
    def block_hidden(self, state: DFlashState) -> torch.Tensor:
        """(depth, H) normed output states of the round's masks, from one forward over the cached context."""
        model, device = self.model, state.pending.device
        start = state.cached
        if len(state.pending):
            positions = torch.arange(start, start + len(state.pending), device=device)[None]
            new = model.context_kv(state.pending[None], positions)
            state.kv = (
                new
                if state.kv is None
                else [
                    (torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2))
                    for (k0, v0), (k1, v1) in zip(state.kv, new, strict=True)
                ]
            )
            state.pending = state.pending[:0]
        depth = model.cfg.depth  # always the whole block it was trained on (masks attend to each other)
        last = len(state.tokens) - 1  # the committed token the target has not read yet
        positions = (last + torch.arange(depth + 1, device=device))[None]
        tokens = torch.tensor([[state.tokens[-1]]], device=device)
        return model.block_hidden(tokens, depth, positions, state.kv, None)[0, 0]
