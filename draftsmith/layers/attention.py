"""The rule every training attention mask here follows: what reaches ``scaled_dot_product_attention`` is a boolean
mask (True = attend) or ``is_causal``, never a float additive mask, and no query row sees no key.

A float mask under autocast is what the fused CUDA kernels have mishandled (pytorch PR #191612: cuDNN reading a
float32 mask as bf16); a boolean one SDPA turns into its own bias in the query's dtype. A row that sees no key is
where the kernels disagree: an additive ``finfo.min`` row gave the uniform average of every value, a boolean all-False
row gives NaN on some kernels, zeros on others (this CPU's), and the backward of a NaN row poisons every gradient.
``tests/test_attention_masks.py`` walks every family's training step and checks both.
"""

from __future__ import annotations

import torch


def sees_itself(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (..., Q, S) bool, True = attend, whose Q queries are its last Q keys (self-attention after S - Q
    earlier keys), with each query that sees no key seeing its own (key S - Q + i for query i).

    Only such rows change (a query whose sequence holds no real token, e.g. a row of padding): every row that sees a
    key keeps its mask, so its values and gradients are the same bit for bit.
    """
    q, s = mask.shape[-2:]
    own = torch.eye(q, dtype=torch.bool, device=mask.device)
    own = torch.cat([own.new_zeros(q, s - q), own], dim=1)  # (Q, S)
    return mask | (own & ~mask.any(-1, keepdim=True))


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool causal self-attention of packed rows (``train.data.collate_packed``): a token sees the
    earlier tokens of its own document only. ``doc_ids`` (B, T): each token's document in its row, 0 on padding
    (padding sees the padding before it, so every query sees at least its own key)."""
    t = doc_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    return (causal & (doc_ids[:, :, None] == doc_ids[:, None, :]))[:, None]
