"""Kangaroo (Liu et al. 2024): self-speculative decoding with double early exiting.

The drafter is the target's own first ``exit_layer`` layers (shared weights, frozen, and the target's KV cache for
them: see ``layers/self_draft.py``), a small trained *adapter* and the target's LM head. The adapter is one
attention layer between two RMSNorms: out = norm(h + attn(input_norm(h))) over the shallow hidden states h (its own
keys/values, caught up on committed tokens from the verification pass's hidden state at ``exit_layer``). Its
attention output starts at zero and its final norm as the target's, so an untrained adapter is plain early exit.

The second early exit stops a round's draft before the first token whose top-1 probability is below
``threshold``. The adapter is all the weights a Kangaroo checkpoint holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

from draftsmith.core.draft import DrafterNetwork
from draftsmith.families.registry import register
from draftsmith.layers.decoder import Attention
from draftsmith.layers.self_draft import SelfDrafter
from draftsmith.layers.shape import LayerShape, borrowed_shape


@dataclass
class KangarooConfig:
    """Shape of a Kangaroo adapter. Target-derived fields are filled by ``from_target``."""

    exit_layer: int = 2
    """The shallow sub-network: the target's layers 0..exit_layer-1."""
    threshold: float = 0.6
    """Stop a draft before its first token of top-1 probability below this (0: draft all K)."""
    shape: LayerShape = LayerShape()
    """The adapter attention's shape (an EAGLE layer's: the target's heads and RoPE, ``borrowed_shape``)."""
    vocab_size: int = 0

    @classmethod
    def from_target(cls, target_config, vocab_size: int, exit_layer: int, threshold: float) -> KangarooConfig:
        return cls(exit_layer, threshold, borrowed_shape(target_config, "Kangaroo"), vocab_size)


@register("kangaroo", config=KangarooConfig)
class KangarooModel(DrafterNetwork):
    """The adapter: ``input_norm``, ``attn`` (q/k/v/o projections) and ``norm``."""

    method = "kangaroo"

    def __init__(self, cfg: KangarooConfig) -> None:
        super().__init__()
        self.cfg = cfg
        shape = cfg.shape
        self.input_norm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.attn = Attention(shape.hidden_size, shape.hidden_size, shape.num_attention_heads, shape.head_dim)
        self.norm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(shape.llama_config(cfg.vocab_size))
        nn.init.zeros_(self.attn.o_proj.weight)  # start as early exit: norm(h)

    @property
    def reads_layers(self) -> tuple[int, ...]:
        return (self.cfg.exit_layer,)

    @property
    def output_size(self) -> int:
        return self.cfg.shape.hidden_size

    def init_from_target(self, final_norm: torch.Tensor) -> None:
        with torch.no_grad():
            self.norm.weight.copy_(final_norm)

    def forward(self, hidden, positions, past_k=None, past_v=None, mask=None):
        """(B, T, H) shallow hidden states at ``positions`` (B, T) after cached keys/values -> (normed (B, T, H),
        new k, new v); ``mask`` (.., T, S+T) bool, True = attend (None: attend to all)."""
        hidden = hidden.to(self.norm.weight.dtype)
        cos, sin = self.rotary(hidden, positions)
        out, k, v = self.attn(self.input_norm(hidden), cos, sin, past_k, past_v, mask)
        return self.norm(hidden + out), k, v

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> SelfDrafter:
        return SelfDrafter(self.cfg.exit_layer, (), self.eval(), self.cfg.threshold)
