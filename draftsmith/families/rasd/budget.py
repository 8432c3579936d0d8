"""How many retrieval nodes a fused RASD tree should add, from this machine's r(m) and the drafter's cost.

Unlike a chain's τ(K), which ``auto_k`` predicts from a per-position acceptance profile, what retrieval adds to a
round depends on the text (what repeats), so it is measured: one calibration decode of a prompt per candidate budget
n (0: the drafter alone) gives τ(n), the tokens verified per round m(n) and the drafter's time per round, retrieval
included, as C(n) decode steps. The predicted speedup is S(n) = τ(n) / (r(m(n)) + C(n)), r read from the measured
verification ratios (``decode.metrics.interpolate_ratio``), and the n of highest S wins (ties: the smaller).

Retrieval drafts no deeper than the round's K, so a model drafter that pays alone at a small K may pay fused at a
larger one: ``choose_fused`` measures the budgets at several depths and keeps the (K, n) of highest S.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.metrics import interpolate_ratio
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.errors import DraftsmithError
from draftsmith.families.rasd.drafter import RasdDrafter

BUDGETS = (0, 2, 4, 8, 16, 32)
_TIE = 1e-9


@dataclass(frozen=True)
class NodesChoice:
    """The retrieval budget chosen and what each considered budget measured.

    Attributes:
        nodes: retrieval nodes per round chosen (the drafter is left set to it).
        predicted_speedup: S of the chosen budget.
        candidates: per budget: ``nodes``, ``tau``, ``verified`` (m, root included), ``cost`` (C, decode steps per
            round) and ``speedup``.
    """

    nodes: int
    predicted_speedup: float
    candidates: list[dict]


def choose_nodes(
    target: Target,
    drafter: RasdDrafter,
    prompt: list[int],
    k: int,
    sampling: Sampling,
    ratios: dict[int, float],
    step_seconds: float,
    budgets: Iterable[int] = BUDGETS,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> NodesChoice:
    """Measure each retrieval budget on ``prompt`` and set ``drafter.nodes`` to the one of highest predicted speedup.

    Args:
        target: the target the drafter drafts for.
        drafter: the fused drafter (its tree policy and K as they will be scored).
        prompt: the calibration prompt.
        k: draft depth per round.
        sampling: as scored.
        ratios: r(m), the target's time to verify m tokens over one decode step, measured on this machine
            (``eval.calibration.verify_ratios``); measure it up to the largest fused tree + 1.
        step_seconds: the target's time per decode step, measured with ``ratios``.
        budgets: retrieval nodes per round to consider.
        max_new_tokens: tokens each calibration decode generates.
        seed: the calibration decodes' generator seed (sampling).
    """
    budgets = sorted(set(budgets))
    if not budgets or budgets[0] < 0 or step_seconds <= 0 or not ratios:
        raise DraftsmithError(
            f"rasd nodes: budgets must be >= 0 and r(m) and the step time measured, got {budgets}, {step_seconds}"
        )
    candidates = []
    for nodes in budgets:
        drafter.nodes = nodes
        result = SpeculativeDecoder(target, drafter, k, sampling).generate(
            prompt, max_new_tokens, torch.Generator().manual_seed(seed)
        )
        drafter.extra_metrics([result])  # the calibration's counts are not the scored run's
        rounds = max(1, len(result.accepted))
        tau = (sum(result.accepted) + len(result.accepted)) / rounds
        verified = sum(result.drafted) / rounds + 1
        cost = result.draft_seconds / rounds / step_seconds
        speedup = tau / (interpolate_ratio(ratios, verified) + cost)
        candidates.append({"nodes": nodes, "tau": tau, "verified": verified, "cost": cost, "speedup": speedup})
    top = max(c["speedup"] for c in candidates)
    best = next(c for c in candidates if c["speedup"] >= top * (1 - _TIE))
    drafter.nodes = best["nodes"]
    return NodesChoice(best["nodes"], best["speedup"], candidates)


@dataclass(frozen=True)
class FusedChoice:
    """The fused tree's depth and retrieval budget chosen (``choose_fused``).

    Attributes:
        k: draft depth per round: retrieval's deepest path (and the model drafter's, up to its ``depth``).
        nodes: retrieval nodes per round.
        predicted_tau: τ measured at (k, nodes) in calibration.
        predicted_speedup: S at (k, nodes).
        candidates: per depth and budget: ``k`` and ``choose_nodes``' ``nodes``, ``tau``, ``verified``, ``cost``,
            ``speedup``.
    """

    k: int
    nodes: int
    predicted_tau: float
    predicted_speedup: float
    candidates: list[dict]


def choose_fused(
    target: Target,
    drafter: RasdDrafter,
    prompt: list[int],
    depths: Iterable[int],
    sampling: Sampling,
    ratios: dict[int, float],
    step_seconds: float,
    budgets: Iterable[int] = BUDGETS,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> FusedChoice:
    """``choose_nodes`` at each draft depth in ``depths`` (the drafter's tree policy kept, its depth set to each);
    the (depth, budget) of highest predicted speedup wins (ties: the shallower, then the smaller budget), and the
    drafter is left set to it. ``ratios`` must reach the widest tree of the deepest depth + 1."""
    depths, budgets = sorted(set(depths)), sorted(set(budgets))
    if not depths or depths[0] < 1:
        raise DraftsmithError(f"rasd depths must be >= 1, got {depths}")
    policy, chosen = replace(drafter.tree, paths=()), []  # a static tree is rebuilt for each depth
    for k in depths:
        drafter.set_tree(policy, k)
        choice = choose_nodes(target, drafter, prompt, k, sampling, ratios, step_seconds, budgets, max_new_tokens, seed)
        chosen.append((k, choice))
    top = max(c.predicted_speedup for _, c in chosen)
    k, best = next((k, c) for k, c in chosen if c.predicted_speedup >= top * (1 - _TIE))
    drafter.set_tree(policy, k)
    drafter.nodes = best.nodes
    tau = next(c["tau"] for c in best.candidates if c["nodes"] == best.nodes)
    candidates = [{"k": k_, **c} for k_, choice in chosen for c in choice.candidates]
    return FusedChoice(k, best.nodes, tau, best.predicted_speedup, candidates)
