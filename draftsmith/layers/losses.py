"""Training losses as plain functions returning per-position values (masking is the caller's)."""

from __future__ import annotations

import math
from typing import Literal, get_args

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


# -- distillation divergences (draft LMs: DistillSpec, Direct Alignment) ------------------------------
# Each takes the student's logits and the teacher's logits or log-probabilities, both (..., V), softened by
# the same ``temperature``, and returns the per-position divergence (...). p is the teacher, q the student.


def _log_probs(student_logits: torch.Tensor, teacher: torch.Tensor, temperature: float):
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}")
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p = F.log_softmax(teacher.float() / temperature, dim=-1).detach()
    return log_q, log_p


def forward_kl(student_logits: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(p || q) = sum_v p (log p - log q): mass-covering, the usual distillation loss."""
    log_q, log_p = _log_probs(student_logits, teacher, temperature)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def reverse_kl(student_logits: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(q || p) = sum_v q (log q - log p): mode-seeking."""
    log_q, log_p = _log_probs(student_logits, teacher, temperature)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


def jsd(student_logits: torch.Tensor, teacher: torch.Tensor, beta: float = 0.5, temperature: float = 1.0):
    """Generalized Jensen-Shannon divergence JSD(β) = β KL(p || m) + (1 - β) KL(q || m), m = β p + (1 - β) q.

    As defined in GKD (Agarwal et al. 2024, arXiv:2306.13649, §3) and used by DistillSpec (arXiv:2310.08461).
    β = 0.5 is the symmetric JSD; β -> 0 (1) behaves like a scaled forward (reverse) KL.
    """
    if not 0 < beta < 1:
        raise ValueError(f"jsd beta must be in (0, 1), got {beta} (use forward_kl / reverse_kl for the ends)")
    log_q, log_p = _log_probs(student_logits, teacher, temperature)
    log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1 - beta)]), dim=0)
    kl_pm = (log_p.exp() * (log_p - log_m)).sum(-1)
    kl_qm = (log_q.exp() * (log_q - log_m)).sum(-1)
    return beta * kl_pm + (1 - beta) * kl_qm


def tvd(student_logits: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Total variation distance ½ sum_v |p - q| = 1 - sum_v min(p, q): one minus the acceptance
    probability of speculative sampling (Leviathan et al. 2023), so minimising it maximises acceptance."""
    log_q, log_p = _log_probs(student_logits, teacher, temperature)
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


def tvd_plus_plus(
    student_logits: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0, eps: float = 1e-6
) -> torch.Tensor:
    """TVD++ (Goel et al. 2024, "Direct Alignment of Draft Model for Speculative Decoding with
    Chat-Fine-Tuned LLMs", arXiv:2403.00858, §3): TVD's gradient read as a policy gradient, with the
    reward normalised as in variance-reduced policy gradients.

    The TVD gradient is ∇ TVD(p, q) = -E_{x~q}[r(x) ∇ log q(x)] with reward r(x) = 1{p(x) > q(x)}. TVD++
    replaces r by (r - μ) / σ, μ and σ the mean and standard deviation of the reward over the batch
    (here: under q, over the masked positions; ``mask`` (...) selects them). The expectation over x is
    taken exactly over the vocabulary, so the baseline μ leaves the gradient unbiased and σ scales it.

    Returns per-position values equal to TVD (what is minimised, comparable across losses) whose gradient
    is the TVD++ one.
    """
    log_q, log_p = _log_probs(student_logits, teacher, temperature)
    q, p = log_q.exp(), log_p.exp()
    with torch.no_grad():
        reward = (p > q).float()  # (..., V)
        weight = q * mask.unsqueeze(-1).to(q.dtype)  # q over the batch's masked positions
        n = mask.to(q.dtype).sum().clamp_min(1)
        mean = (weight * reward).sum() / n
        std = ((weight * (reward - mean) ** 2).sum() / n).sqrt()
        advantage = (reward - mean) / (std + eps)
    surrogate = -(q * advantage).sum(-1)  # gradient: -E_{x~q}[advantage(x) ∇ log q(x)]
    value = 0.5 * (p - q).abs().sum(-1)
    return value.detach() + surrogate - surrogate.detach()


DIVERGENCES = ("fkl", "rkl", "jsd", "tvd", "tvd++")
"""Names ``distillation_loss`` accepts."""


def distillation_loss(
    name: str,
    student_logits: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    beta: float = 0.5,
) -> torch.Tensor:
    """Masked mean of divergence ``name`` (one of ``DIVERGENCES``) over positions where ``mask`` (...) is 1."""
    if name == "fkl":
        values = forward_kl(student_logits, teacher, temperature)
    elif name == "rkl":
        values = reverse_kl(student_logits, teacher, temperature)
    elif name == "jsd":
        values = jsd(student_logits, teacher, beta, temperature)
    elif name == "tvd":
        values = tvd(student_logits, teacher, temperature)
    elif name == "tvd++":
        values = tvd_plus_plus(student_logits, teacher, mask.bool(), temperature)
    else:
        raise ValueError(f"unknown distillation loss {name!r} (known: {', '.join(DIVERGENCES)})")
    return masked_mean(values, mask)


# -- acceptance-rate losses (LK losses: Samarin et al. 2026, "LK Losses: Direct Acceptance Rate Optimization for
# Speculative Decoding", arXiv:2602.23881, as vllm-project/speculators implements them in losses/eager.py:
# ``neg_log_acceptance_loss`` (``nla``) and ``lk_hybrid_loss``). Each takes the student's logits and the teacher's
# probabilities p, both (..., V), and returns per-position values (...). The acceptance probability of speculative
# sampling is alpha = sum_v min(p, q) = 1 - TV(p, q) (Leviathan et al. 2023).

NLA_EPS = 1e-5
"""Floor of alpha in -log alpha (speculators' ``_NLA_EPS``): a position the draft misses entirely costs
-log(1e-5) ~ 11.5 and no gradient, instead of infinity."""


def acceptance(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p(v), q(v)), q = softmax(student_logits): (..., V) -> (...), differentiable in the logits."""
    q = torch.softmax(student_logits.float(), dim=-1)
    return torch.minimum(q, teacher_probs.float()).sum(-1)


def neg_log_acceptance(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """-log alpha (speculators' ``nla``; the LK paper's acceptance loss): TV's optimum with its gradient scaled by
    1 / alpha, so it does not vanish while alpha is small. A one-hot p makes it the cross-entropy. (...)."""
    return -torch.log(acceptance(student_logits, teacher_probs).clamp_min(NLA_EPS))


def lk_hybrid(student_logits: torch.Tensor, teacher_probs: torch.Tensor, eta: float = 3.0) -> torch.Tensor:
    """lambda KL(p || q) + (1 - lambda) TV(p, q) with lambda = exp(-eta sg[alpha]) (speculators' ``lk_hybrid``; the
    LK paper's hybrid): KL's strong gradient while the draft is far from p, TV (= 1 - alpha, acceptance itself) as it
    gets close. The weight is detached: it chooses the blend, its gradient is not followed. (...)."""
    p = teacher_probs.float()
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    alpha = torch.minimum(log_q.exp(), p).sum(-1)
    kl = (torch.xlogy(p, p) - p * log_q).sum(-1)  # 0 log 0 = 0: p is exactly 0 off the loss vocabulary's support
    weight = torch.exp(-eta * alpha.detach())
    return weight * kl + (1 - weight) * (1 - alpha)


TokenLoss = Literal["kl", "nla", "lk_hybrid"]
TOKEN_LOSSES: tuple[str, ...] = get_args(TokenLoss)
"""Names ``token_loss`` accepts."""


def token_loss(name: str, student_logits: torch.Tensor, teacher_probs: torch.Tensor, eta: float = 3.0) -> torch.Tensor:
    """Per-position token loss ``name`` (one of ``TOKEN_LOSSES``) of a drafter's logits against the target's
    probabilities p, both (..., V) -> (...): ``kl`` the soft cross-entropy (forward KL plus p's entropy, the same
    gradient), ``nla`` -log alpha, ``lk_hybrid`` the blend with temperature ``eta``."""
    if name == "kl":
        return soft_cross_entropy(student_logits, teacher_probs)
    if name == "nla":
        return neg_log_acceptance(student_logits, teacher_probs)
    if name == "lk_hybrid":
        return lk_hybrid(student_logits, teacher_probs, eta)
    raise ValueError(f"unknown token loss {name!r} (known: {', '.join(TOKEN_LOSSES)})")


def topk_teacher_logprobs(ids: torch.Tensor, logprobs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full (..., V) teacher log-probabilities from stored top-k ones: (..., K) ids and log-probs.

    The k stored tokens keep their log-probabilities; the mass they leave, 1 - sum(p_topk), is spread
    evenly over the other V - k tokens (unknown to the data), so every divergence stays finite.
    """
    k = ids.shape[-1]
    tail = (1 - logprobs.float().exp().sum(-1, keepdim=True)).clamp_min(1e-8) / max(1, vocab_size - k)
    out = tail.log().expand(*ids.shape[:-1], vocab_size).clone()
    return out.scatter_(-1, ids.long(), logprobs.float())
