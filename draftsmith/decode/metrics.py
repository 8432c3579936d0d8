"""Acceptance and speed metrics aggregated over decoded prompts."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from draftsmith.decode.verifier import DecodeResult


@dataclass
class DrafterMetrics:
    """What the verifier measured for one drafter on a prompt set.

    Attributes:
        alpha: accepted draft tokens / drafted tokens.
        tau: mean tokens committed per verification call (accepted + 1).
        tau_full: tau over the rounds that drafted to full depth (min(K, the drafter's deepest);
            the end of a generation drafts less); what ``val/tau_est`` estimates. None in reports saved before it
            was measured.
        accept_at: per draft position i (1-based, index i-1): fraction of rounds
            whose i-th draft token was accepted (unconditional).
        accept_given_reached: per position: accepted / rounds that drafted to depth i
            and reached it (EAGLE's "n-alpha").
        rounds: verification calls (prefill excluded).
        target_calls: target forwards including prefill.
        tokens: generated tokens.
        seconds: wall-clock of speculative decoding.
        tokens_per_s: tokens / seconds.
        speedup: tokens_per_s / plain decoding's tokens_per_s, same run.
        cost_ratio: c, the drafter's time per drafted token / the target's time per plain decoding step.
        mean_drafted: mean tokens drafted per round.
        verify_ratio: r, the target's time to verify one round's tokens (mean_drafted + 1 of them) / its time for
            one decode step, measured in the same run (``score_drafters``); 1.0 where it was not measured; None in
            reports saved before it was.
        ideal_speedup: tau / (r + mean_drafted * c): the speedup this τ and drafter cost allow on this machine,
            with the verification forward costed as measured.
        greedy_exact: prompts whose output equals plain greedy decoding (greedy only; else None).
    """

    name: str
    k: int
    alpha: float
    tau: float
    tau_full: float | None
    accept_at: list[float]
    accept_given_reached: list[float]
    rounds: int
    target_calls: int
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float
    cost_ratio: float
    mean_drafted: float
    verify_ratio: float | None
    ideal_speedup: float
    greedy_exact: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def interpolate_ratio(ratios: dict[int, float], tokens: float) -> float:
    """r at ``tokens`` verified tokens, linear between the measured token counts (``ratios``: count -> r)."""
    points = sorted(ratios.items())
    if tokens <= points[0][0]:
        return points[0][1]
    for (m0, r0), (m1, r1) in zip(points, points[1:], strict=False):
        if tokens <= m1:
            return r0 + (r1 - r0) * (tokens - m0) / (m1 - m0)
    return points[-1][1]


@dataclass
class PlainMetrics:
    tokens: int
    seconds: float
    tokens_per_s: float
    target_calls: int

    def to_dict(self) -> dict:
        return asdict(self)


def plain_metrics(results: list[DecodeResult]) -> PlainMetrics:
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    return PlainMetrics(tokens, seconds, tokens / seconds, sum(r.target_calls for r in results))


def drafter_metrics(
    name: str,
    k: int,
    results: list[DecodeResult],
    plain: list[DecodeResult],
    greedy: bool,
    verify_ratios: dict[int, float] | None = None,
) -> DrafterMetrics:
    """Aggregate one drafter's decodes; ``verify_ratios`` (verified tokens -> r, measured in the same run) costs
    the verification forward in ``ideal_speedup`` (without it, r = 1: verifying as cheap as one step)."""
    accepted = [a for r in results for a in r.accepted]
    drafted = [d for r in results for d in r.drafted]
    depth = [d for r in results for d in r.depth]
    rounds = len(accepted)
    reached = [sum(1 for a, d in zip(accepted, depth, strict=True) if d >= i and a >= i - 1) for i in range(1, k + 1)]
    hits = [sum(1 for a in accepted if a >= i) for i in range(1, k + 1)]
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    base = plain_metrics(plain)
    step_seconds = base.seconds / base.target_calls
    cost = (sum(r.draft_seconds for r in results) / max(1, sum(drafted))) / step_seconds
    tau = (sum(accepted) + rounds) / max(1, rounds)
    mean_drafted = sum(drafted) / max(1, rounds)
    r = interpolate_ratio(verify_ratios, mean_drafted + 1) if verify_ratios else 1.0
    full_depth = max(depth, default=0)
    full = [a for a, d in zip(accepted, depth, strict=True) if d == full_depth]
    return DrafterMetrics(
        name=name,
        k=k,
        alpha=sum(accepted) / max(1, sum(drafted)),
        tau=tau,
        tau_full=(sum(full) + len(full)) / max(1, len(full)),
        accept_at=[h / max(1, rounds) for h in hits],
        accept_given_reached=[h / max(1, r) for h, r in zip(hits, reached, strict=True)],
        rounds=rounds,
        target_calls=sum(r.target_calls for r in results),
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
        speedup=(tokens / seconds) / base.tokens_per_s,
        cost_ratio=cost,
        mean_drafted=mean_drafted,
        verify_ratio=r,
        ideal_speedup=tau / (r + mean_drafted * cost),
        greedy_exact=sum(r.tokens == p.tokens for r, p in zip(results, plain, strict=True)) if greedy else None,
    )


def by_category(
    categories: list[str | None],
    results: dict[str, list[DecodeResult]],
    plain: list[DecodeResult],
    k: int,
    greedy: bool,
) -> dict[str, dict[str, dict]]:
    """Per category, per drafter: tau, speedup (over plain decoding of the same prompts) and the prompt count.

    Args:
        categories: each prompt's category (``Prompt.category``; None is grouped as "none").
        results: drafter name -> its decodes, one per prompt, in the order of ``categories``.
        plain: plain decoding's results, same order.
        k: draft length, as given to ``drafter_metrics``.
        greedy: whether decoding was greedy, as given to ``drafter_metrics``.
    """
    if any(len(r) != len(categories) for r in [plain, *results.values()]):
        raise ValueError("by_category: every result list needs one decode per category entry")
    groups: dict[str, list[int]] = {}
    for i, category in enumerate(categories):
        groups.setdefault(category or "none", []).append(i)
    out = {}
    for category, idx in groups.items():
        base = [plain[i] for i in idx]
        out[category] = {}
        for name, decodes in results.items():
            m = drafter_metrics(name, k, [decodes[i] for i in idx], base, greedy)
            out[category][name] = {"tau": m.tau, "speedup": m.speedup, "prompts": len(idx)}
    return out


@dataclass(frozen=True)
class TauGain:
    """How much more one drafter commits per round than another on the same prompts (``tau_gain``).

    Attributes:
        mean: the mean over prompts of τ(other) − τ(base), each prompt's τ its own (accepted + rounds) / rounds.
        low, high: its 95% interval, a paired bootstrap over the prompts.
        better, worse: prompts whose τ rose, fell.
        prompts: prompts compared.
    """

    mean: float
    low: float
    high: float
    better: int
    worse: int
    prompts: int

    @property
    def significant(self) -> bool:
        """The interval excludes 0: a gain (or loss) the spread between prompts does not explain."""
        return self.low > 0 or self.high < 0


def tau_gain(
    base: list[tuple[int, int]], other: list[tuple[int, int]], resamples: int = 10_000, seed: int = 0
) -> TauGain:
    """τ's gain from ``base`` to ``other`` with the spread between prompts: both per prompt (accepted draft tokens,
    rounds), as ``ScoreRow.prompt_rounds`` records them, on the same prompts in the same order. Greedy decoding is
    deterministic, so the interval is the prompts' spread, not the machine's."""
    if len(base) != len(other) or not base:
        raise ValueError(f"tau_gain: {len(base)} and {len(other)} prompts; the same prompts are needed")
    diffs = [(a2 + r2) / max(1, r2) - (a1 + r1) / max(1, r1) for (a1, r1), (a2, r2) in zip(base, other, strict=True)]
    n, rng = len(diffs), random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    return TauGain(
        mean=sum(diffs) / n,
        low=means[int(0.025 * resamples)],
        high=means[int(0.975 * resamples) - 1],
        better=sum(d > 0 for d in diffs),
        worse=sum(d < 0 for d in diffs),
        prompts=n,
    )


def prompt_windows(results: list[DecodeResult], count: int) -> list[dict]:
    """Split per-prompt results into ``count`` runs of consecutive prompts; α and τ of each."""
    bounds = [round(i * len(results) / count) for i in range(count + 1)]
    out = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if start == end:
            continue
        accepted = sum(sum(r.accepted) for r in results[start:end])
        drafted = sum(sum(r.drafted) for r in results[start:end])
        rounds = sum(len(r.accepted) for r in results[start:end])
        out.append(
            {
                "prompts": [start, end],
                "alpha": accepted / max(1, drafted),
                "tau": (accepted + rounds) / max(1, rounds),
                "rounds": rounds,
            }
        )
    return out
