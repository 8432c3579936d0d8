"""Cost-aware draft length (``score --k auto``): pick the K, or static tree, of highest predicted speedup.

One round drafts, then verifies its draft in one target forward, and commits τ tokens (accepted + 1).
Costs are in plain decode steps of the target:

- a **chain** of K tokens costs ``K * c`` to draft (c: the drafter's time per drafted token, ``cost_ratio``)
  plus ``r(K + 1)`` to verify (r: the target's time to verify m tokens / one decode step, measured;
  ``verify_ratio``), so S(K) = τ(K) / (r(K + 1) + K * c), as ``DrafterMetrics.ideal_speedup``;
- a **static tree** of N nodes and depth D costs ``D * c_forward`` to draft (one drafter forward per depth
  level, whatever its width) plus ``r(N + 1)`` to verify.

r is read from the measured points with ``interpolate_ratio``: linear between them, held at the last measured
value beyond them, so measure r up to the largest K + 1 (or N + 1) searched, or large drafts look too cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

from draftsmith.decode.metrics import interpolate_ratio
from draftsmith.errors import DraftsmithError
from draftsmith.layers.tree_draft import static_tree

TREE_SIZES = (2, 4, 8, 16, 32, 64)
_TIE = 1e-9  # relative: speedups this close count as equal, and the smaller draft wins


@dataclass(frozen=True)
class KChoice:
    """The chosen draft shape and what it is predicted to give.

    Attributes:
        k: draft depth (chain length; for trees, the deepest path).
        tree_size: tree nodes, or None for a chain.
        predicted_tau: expected tokens committed per round.
        predicted_speedup: τ / (predicted cost of a round in decode steps).
        candidates: every shape considered, as dicts with ``k``, ``tree_size``, ``tau``, ``speedup``.
    """

    k: int
    tree_size: int | None
    predicted_tau: float
    predicted_speedup: float
    candidates: list[dict]


@dataclass(frozen=True)
class Shape(KChoice):
    """The draft shape ``score --k auto`` chose for one drafter (a ``KChoice``), and what it was chosen from (a score
    row's ``auto_k``)."""

    cost: float
    """c measured in the calibration decode (per drafted token; per drafter forward for static trees)."""
    source: str
    """Where the acceptance profile came from: ``validation`` (the drafter's recorded held-out top-1 accuracy per
    depth) or ``calibration`` (an untimed decode of the first prompt at K = 8)."""
    nodes: int | None = None
    """RASD: retrieval nodes per round chosen for the fused tree (``families.rasd.budget.choose_fused``), None for other
    drafters; ``k``, ``predicted_tau`` and ``predicted_speedup`` are then the fused tree's, measured in calibration,
    and ``candidates`` the model drafter's shapes alone."""
    nodes_candidates: list[dict] | None = None
    """RASD: each depth and retrieval budget considered: ``k``, ``nodes``, ``tau``, ``verified`` (m), ``cost`` (C: the
    drafter's time per round, retrieval included, in decode steps) and ``speedup``."""
    model_depth: int | None = None
    """RASD: the model drafter's depth per round (its own K alone); retrieval's paths go to ``k``."""

    @classmethod
    def of(cls, choice: KChoice, cost: float, source: str) -> Shape:
        return cls(**vars(choice), cost=cost, source=source)

    def to_dict(self) -> dict:
        """As a report saves it (rounded)."""
        return (
            {
                "k": self.k,
                "tree_size": self.tree_size,
                "predicted_tau": round(self.predicted_tau, 4),
                "predicted_speedup": round(self.predicted_speedup, 4),
                "cost": round(self.cost, 5),
                "source": self.source,
                "candidates": self.candidates,
            }
            | ({"nodes": self.nodes, "nodes_candidates": self.nodes_candidates} if self.nodes is not None else {})
            | ({"model_depth": self.model_depth} if self.model_depth is not None else {})
        )

    @classmethod
    def from_dict(cls, d: dict) -> Shape:
        """A saved report's ``auto_k``."""
        fields = ("k", "tree_size", "predicted_tau", "predicted_speedup", "candidates", "cost", "source")
        rasd = {
            "nodes": d.get("nodes"),
            "nodes_candidates": d.get("nodes_candidates"),
            "model_depth": d.get("model_depth"),
        }
        return cls(**{f: d[f] for f in fields}, **rasd)


def chain_tau(accept: Sequence[float], k: int) -> float:
    """Expected tokens committed by a chain of ``k`` draft tokens: 1 + Σ_{i≤k} Π_{j≤i} a_j.

    Args:
        accept: conditional acceptance a_1..a_D, a_i = P(draft token i accepted | tokens 1..i-1 accepted)
            (``conditional_acceptance(metrics.accept_at)``, or ``metrics.accept_given_reached``).
            Positions beyond D are assumed to accept at a_D.
        k: draft length, >= 0.
    """
    _check_probabilities(accept, "acceptance")
    if k < 0:
        raise DraftsmithError(f"draft length must be >= 0, got {k}")
    tau, reach = 1.0, 1.0
    for i in range(k):
        reach *= accept[min(i, len(accept) - 1)]
        tau += reach
    return tau


def conditional_acceptance(accept_at: Sequence[float]) -> list[float]:
    """Conditional acceptance a_i from unconditional ``accept_at`` (fraction of rounds whose i-th token was
    accepted, ``DrafterMetrics.accept_at``): a_i = accept_at[i] / accept_at[i-1]; 0 where no round got that far.

    ``accept_at`` should come from rounds that all drafted the full K_max (``accept_at`` of rounds cut short
    at the end of a generation reads slightly low at deep positions).
    """
    _check_probabilities(accept_at, "accept_at")
    out, prev = [], 1.0
    for p in accept_at:
        out.append(min(1.0, p / prev) if prev > 0 else 0.0)
        prev = p
    return out


def unconditional_acceptance(accept: Sequence[float]) -> list[float]:
    """``accept_at`` (fraction of rounds whose i-th token is accepted) from conditional acceptance:
    accept_at[i] = Π_{j≤i} a_j. The inverse of ``conditional_acceptance``; τ(K) = 1 + Σ_{i≤K} accept_at[i]."""
    _check_probabilities(accept, "acceptance")
    out, reach = [], 1.0
    for a in accept:
        reach *= a
        out.append(reach)
    return out


def tree_tau(accuracy: Sequence[Sequence[float]], paths: Iterable[tuple[int, ...]]) -> float:
    """Expected tokens committed by a static tree: 1 + Σ_paths Π_j accuracy[j][r_j].

    Treats depths as independent (Medusa's assumption), as ``static_tree`` does when it builds the tree.

    Args:
        accuracy: accuracy[d][r] = P(the target's token at depth d+1 is the drafter's rank-r choice).
        paths: the tree's rank paths (r_1, .., r_d), prefix-closed.
    """
    return 1.0 + sum(prod(accuracy[j][r] for j, r in enumerate(path)) for path in paths)


def choose_chain_k(
    accept: Sequence[float], ratios: dict[int, float], cost: float, ks: Iterable[int] = range(1, 9)
) -> KChoice:
    """The chain length of highest predicted speedup S(K) = τ(K) / (r(K + 1) + K * c); ties go to the smaller K.

    Args:
        accept: conditional acceptance per position (see ``chain_tau``; from ``accept_at`` use
            ``conditional_acceptance``). Positions beyond its length accept at its last value.
        ratios: measured verification cost, verified tokens -> r (r(1) = 1).
        cost: c, the drafter's time per drafted token / one plain decode step.
        ks: draft lengths to consider, each >= 1.
    """
    _check_costs(ratios, cost)
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise DraftsmithError(f"draft lengths to search must be >= 1, got {ks}")
    candidates = []
    for k in ks:
        tau = chain_tau(accept, k)
        speedup = tau / (interpolate_ratio(ratios, k + 1) + k * cost)
        candidates.append({"k": k, "tree_size": None, "tau": tau, "speedup": speedup})
    return _best(candidates)


def choose_tree(
    accuracy: Sequence[Sequence[float]],
    ratios: dict[int, float],
    cost_per_forward: float,
    sizes: Iterable[int] = TREE_SIZES,
    max_depth: int = 8,
) -> KChoice:
    """The static tree (``static_tree``) of highest predicted speedup over sizes and depths 1..max_depth.

    A tree of N nodes and depth D is predicted to give τ = ``tree_tau`` at a cost of r(N + 1) + D * c_forward.
    Ties go to the shallower tree, then the smaller one.

    Args:
        accuracy: per-depth top-k accuracies, as ``TreeDrafter.topk_accuracy``.
        ratios: measured verification cost, verified tokens -> r (r(1) = 1).
        cost_per_forward: the drafter's time per forward (one per depth level) / one plain decode step.
        sizes: tree sizes (nodes) to consider.
        max_depth: deepest tree to consider.
    """
    _check_costs(ratios, cost_per_forward)
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 1 or max_depth < 1:
        raise DraftsmithError(f"tree sizes and depth must be >= 1, got sizes {sizes}, max depth {max_depth}")
    for row in accuracy:
        _check_probabilities(row, "top-k accuracy")
    seen: dict[tuple[int, int], dict] = {}
    for size in sizes:
        for depth in range(1, max_depth + 1):
            paths = static_tree([list(row) for row in accuracy], size, depth)
            shape = (max(len(p) for p in paths), len(paths))  # small tables can give fewer, shallower paths
            if shape in seen:
                continue
            tau = tree_tau(accuracy, paths)
            speedup = tau / (interpolate_ratio(ratios, shape[1] + 1) + shape[0] * cost_per_forward)
            seen[shape] = {"k": shape[0], "tree_size": shape[1], "tau": tau, "speedup": speedup}
    return _best(sorted(seen.values(), key=lambda c: (c["k"], c["tree_size"])))


def _best(candidates: list[dict]) -> KChoice:
    """The first candidate within ``_TIE`` of the best speedup (candidates come smallest first)."""
    top = max(c["speedup"] for c in candidates)
    best = next(c for c in candidates if c["speedup"] >= top * (1 - _TIE))
    return KChoice(best["k"], best["tree_size"], best["tau"], best["speedup"], candidates)


def _check_probabilities(values: Sequence[float], what: str) -> None:
    if not values:
        raise DraftsmithError(f"{what}: no values were measured")
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise DraftsmithError(f"{what} values must lie in [0, 1], got {list(values)}")


def _check_costs(ratios: dict[int, float], cost: float) -> None:
    if not ratios or any(r <= 0 for r in ratios.values()):
        raise DraftsmithError(f"verification ratios must be measured and positive, got {ratios}")
    if cost < 0:
        raise DraftsmithError(f"drafting cost must be >= 0, got {cost}")
