"""Cheap teacher-forced estimate of the verifier's mean accepted length τ (``val/tau_est``)."""

from __future__ import annotations

import torch


def acceptance_prob(p: torch.Tensor, q: torch.Tensor, greedy: bool) -> torch.Tensor:
    """Probability the draft token is accepted: (..., V) target p, drafter q -> (...).

    Greedy: 1 if the drafter's argmax is the target's. Sampling: sum_v min(p, q).
    """
    if greedy:
        return (q.argmax(-1) == p.argmax(-1)).float()
    return torch.minimum(p, q).sum(-1)


def expected_tau(step_accept: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """E[tokens per verification call] of a K-chain from per-step acceptance probabilities.

    Args:
        step_accept: (K, N) acceptance probability of draft step j at anchor n, given
            the previous steps were accepted (the drafter unrolled as it drafts).
        valid: (K, N) whether step j at anchor n has a target token to compare to.

    Returns:
        scalar tau = 1 + mean_n sum_j prod_{l <= j} a_{l,n}, over anchors valid for all K steps.
    """
    keep = valid.all(0)
    if not keep.any():
        return torch.tensor(float("nan"))
    a = step_accept[:, keep]
    return 1 + a.cumprod(0).sum(0).mean()
