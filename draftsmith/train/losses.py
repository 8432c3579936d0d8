"""Training losses as plain functions returning per-position values (masking is the caller's)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_cross_entropy(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """-sum_v p(v) log q(v): (..., V) logits and probs -> (...)."""
    return -(teacher_probs * F.log_softmax(student_logits.float(), dim=-1)).sum(-1)


def feature_regression(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """EAGLE-1's smooth L1 between predicted and real next features: (..., H) -> (...)."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1)
