"""Sampling settings and the acceptance rules of speculative decoding (the one home of that math)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen from the target's distribution.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_p: nucleus sampling mass, applied to the tempered distribution.
    """

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution ``sampling`` draws from: (..., V) logits -> (..., V) probabilities.

    Greedy gives the one-hot argmax, so the same acceptance rules apply to both modes.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    p = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always the first token)
        drop = sorted_p.cumsum(-1) - sorted_p >= sampling.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter(-1, order, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token from a (V,) distribution."""
    return int(torch.multinomial(p, 1, generator=generator))


def one_hot(token: int, vocab: int) -> torch.Tensor:
    q = torch.zeros(vocab)
    q[token] = 1.0
    return q


def verify_chain_greedy(p_argmax: list[int], draft: list[int]) -> tuple[int, int]:
    """Greedy verification of a chain.

    Args:
        p_argmax: the target's argmax at each of the k+1 verified positions.
        draft: the k drafted tokens.

    Returns:
        (number of accepted draft tokens n, the target's token after them).
    """
    n = 0
    while n < len(draft) and draft[n] == p_argmax[n]:
        n += 1
    return n, p_argmax[n]


def verify_chain_sampling(
    p: torch.Tensor, q: torch.Tensor, draft: list[int], generator: torch.Generator | None
) -> tuple[int, int]:
    """Lossless speculative sampling of a chain (Leviathan et al. 2023, Chen et al. 2023).

    Draft token i is kept with probability min(1, p_i(d)/q_i(d)); at the first
    rejection the replacement is drawn from norm(max(0, p_i - q_i)); if all k
    are kept a bonus token is drawn from p_k. The output is distributed exactly
    as sampling from p alone.

    Args:
        p: (k+1, V) target distributions at the verified positions.
        q: (k, V) the drafter's distributions the draft tokens were drawn from.
        draft: the k drafted tokens.
    """
    for i, d in enumerate(draft):
        u = torch.rand((), generator=generator)
        if u * q[i, d] < p[i, d]:  # u < p/q without dividing by q
            continue
        return i, sample(residual(p[i], q[i]), generator)
    return len(draft), sample(p[len(draft)], generator)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what to sample from after a rejection."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    # p == q on the support: a rejection has probability 0 there, but keep p as a safe fallback
    return r / total if total > 0 else p
