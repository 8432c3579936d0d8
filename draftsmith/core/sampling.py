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
    """Draw one token from a (V,) distribution (on ``generator``'s device: a GPU drafter's q and a CPU generator)."""
    if generator is not None:
        p = p.to(generator.device)
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


def verify_chain_judged(
    p: torch.Tensor, q: torch.Tensor, draft: list[int], judged: list[bool], generator: torch.Generator | None
) -> tuple[int, int, int]:
    """Judge decoding's chain rule (Bachmann et al. 2025): LOSSY by design.

    Draft token i is kept when the lossless rule keeps it (``verify_chain_sampling``'s test; greedy: one-hot ``p``
    and ``q`` make it the argmax test) or, failing that, when the judge accepts it (``judged[i]``); at the first
    token neither keeps, the replacement is the lossless rule's (the residual; greedy: the argmax). Output then
    follows the target only where the judge rejects.

    Returns:
        (kept draft tokens n, the target's token after them, how many of the n only the judge kept).
    """
    rescued = 0
    for i, d in enumerate(draft):
        if torch.rand((), generator=generator) * q[i, d] < p[i, d]:
            continue
        if not judged[i]:
            return i, sample(residual(p[i], q[i]), generator), rescued
        rescued += 1
    return len(draft), sample(p[len(draft)], generator), rescued


def draw_candidates(
    q: torch.Tensor, n: int, replacement: bool, generator: torch.Generator | None
) -> tuple[list[int], list[torch.Tensor]]:
    """Draw ``n`` candidate tokens from a (V,) distribution, and the distribution each was drawn from.

    With replacement the draws are i.i.d. (each from ``q``: SpecInfer's and SpecTr's candidates); without,
    draw i comes from ``q`` with the earlier draws removed and renormalised (RSD's candidates), and fewer than
    ``n`` come back when ``q``'s support is smaller. The rows returned are what the acceptance rules must see.
    """
    tokens, rows = [], []
    for _ in range(n):
        row = q if replacement else remainder(q, tokens)
        if row is None:
            break
        tokens.append(sample(row, generator))
        rows.append(row)
    return tokens, rows


def remainder(q: torch.Tensor, drawn: list[int]) -> torch.Tensor | None:
    """``q`` with the ``drawn`` tokens removed, renormalised: the row of the next draw without replacement (None when
    nothing is left)."""
    row = q.clone()
    row[drawn] = 0.0
    total = row.sum()
    return row / total if total > 0 else None


def spectr_rho(p: torch.Tensor, q: torch.Tensor, m: int) -> float:
    """SpecTr's ρ for ``m`` i.i.d. candidates from ``q`` verified against ``p``: the smallest ρ in [1, m] that keeps
    K-SEQ's residual non-negative, i.e. with β(ρ) = Σ min(q, p/ρ), (1 - (1 - β)^m) / β <= ρ (Sun et al. 2023,
    Algorithm 2 and its validity condition). A smaller ρ accepts more: the chance some candidate is accepted,
    1 - (1 - β(ρ))^m, falls as ρ grows. Found by bisection whose upper end is always valid (ρ = m is)."""

    def valid(rho: float) -> bool:
        beta = float(torch.minimum(q, p / rho).sum())
        return beta <= 0 or (1 - (1 - beta) ** m) / beta <= rho * (1 + 1e-6)

    if m <= 1 or valid(1.0):
        return 1.0
    lo, hi = 1.0, float(m)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if valid(mid) else (mid, hi)
    return hi


def verify_kseq(
    p: torch.Tensor, q: torch.Tensor, candidates: list[int], generator: torch.Generator | None
) -> tuple[int | None, int]:
    """SpecTr's k-sequential selection (K-SEQ) of one of ``m`` i.i.d. candidates drawn from ``q``; lossless for ``p``.

    Candidate i is accepted with probability min(1, p(x_i) / (ρ q(x_i))), in draw order; when all are rejected the
    token is drawn from the residual p - min(q, p/ρ) (1 - (1 - β)^m) / β, normalised. Token x then comes out with
    probability min(q, p/ρ)(x) (1 - (1 - β)^m) / β + that residual's share = p(x). With m = 1 and ρ = 1 this is
    ordinary speculative sampling.

    Returns:
        (index of the accepted candidate or None, the token chosen).
    """
    m = len(candidates)
    rho = spectr_rho(p, q, m)
    for i, x in enumerate(candidates):
        if torch.rand((), generator=generator) * rho * q[x] < p[x]:
            return i, x
    kept = torch.minimum(q, p / rho)
    beta = float(kept.sum())
    share = (1 - (1 - beta) ** m) / beta if beta > 0 else 0.0
    r = (p - kept * share).clamp_min(0)  # >= 0 up to rounding, by the choice of ρ
    total = r.sum()
    return None, sample(r / total if total > 0 else p, generator)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what to sample from after a rejection."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    # p == q on the support: a rejection has probability 0 there, but keep p as a safe fallback
    return r / total if total > 0 else p
