"""Building blocks of the drafters' own layers: RoPE attention over passed-in keys/values with a boolean mask
(EAGLE's decoder layers, Kangaroo's adapter), the causal decoder layer over the target's hidden states that starts as
the identity (Hydra++'s prefix layer, Clover's augmenting block), and the zero-initialised residual SiLU block of the
multi-head drafters (Medusa, Hydra, Clover)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)


class Attention(nn.Module):
    """Multi-head RoPE attention whose keys/values of earlier steps are passed in (TTT, drafting, caches).

    Args:
        in_features: width of its input (EAGLE-3's first layer: 2H, embeds and feature side by side).
        hidden_size: width of its output.
        num_heads: attention heads (as many key/value heads).
        head_dim: width of a head.
    """

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        inner = num_heads * head_dim
        self.num_heads, self.head_dim = num_heads, head_dim
        self.q_proj = nn.Linear(in_features, inner, bias=False)
        self.k_proj = nn.Linear(in_features, inner, bias=False)
        self.v_proj = nn.Linear(in_features, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden_size, bias=False)

    def forward(self, x, cos, sin, past_k, past_v, mask):
        """x (B, T, in); past_k/v (B, nh, S, hd) or None; mask (T, S+T) bool, True = attend."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), k, v


class PrefixLayer(nn.Module):
    """A causal pre-norm decoder layer over the target's hidden states, with a residual, that starts as the identity
    (its attention's output and MLP's down projections zero): Hydra++'s prefix layer, Clover's augmenting block.

    Args:
        config: the one-layer Llama config of its shape (``LayerShape.llama_config``).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(h, config.rms_norm_eps)
        self.self_attn = Attention(h, h, config.num_attention_heads, config.head_dim)
        self.post_attention_layernorm = LlamaRMSNorm(h, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.rotary = LlamaRotaryEmbedding(config)
        nn.init.zeros_(self.self_attn.o_proj.weight)  # start as the identity: f' = f
        nn.init.zeros_(self.mlp.down_proj.weight)

    def forward(self, x, positions, past_k, past_v, mask):
        """x (B, T, H) at positions (B, T) after cached keys/values -> (B, T, H), new k, new v."""
        cos, sin = self.rotary(x, positions)
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, mask)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b), W and b zero-initialised (the block starts as the identity)."""

    def __init__(self, hidden: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_layers))
        self.act = nn.SiLU()
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))
        return x
