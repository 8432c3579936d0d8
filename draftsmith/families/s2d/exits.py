"""S2D's sub-network choice in ``score``: each sorted draft LM drafts with the sub-network of highest predicted speed
on the target being scored, chosen by the cost model ``--k auto`` picks K with (``decode.auto_k``).

Sub-network n is a draft LM of its own: its acceptance a_n per position and its cost c_n (its time per drafted token
/ one plain decode step of the target) are measured as ``calibration.choose_shapes`` measures a drafter without a
validation profile, in untimed decodes of the first held-out prompts at K = 8 (``calibration.CALIBRATION_PROMPTS``
of them, after a warm-up: one prompt whose drafts were all accepted decided the sub-network alone before); r(m),
the target's time to verify m tokens / one decode step, once per target. Its predicted speed at K is
S(n, K) = τ_n(K) / (r(K + 1) + K·c_n)
(``auto_k.choose_chain_k``); the chosen sub-network maximises it (at the run's K, or over K = 1..8 with ``--k auto``),
ties going to the shallower one. The choice, and every sub-network's numbers, go in the drafter's score row (``s2d``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from draftsmith.core.draft import Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode import auto_k
from draftsmith.decode.metrics import drafter_metrics
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.s2d.network import S2DDrafter

TIE = 1e-9
"""Relative: predicted speeds this close count as equal, and the shallower sub-network wins."""
CALIBRATION_TOKENS = 64
"""Tokens each sub-network decodes in its calibration (after an 8-token warm-up)."""


@dataclass(frozen=True)
class ExitChoice:
    """The sub-network a sorted draft LM drafts with for one target, and what it was chosen from.

    Attributes:
        layers: the chosen sub-network's depth.
        k: the draft length its predicted speed is for (the run's K, or the best one with ``--k auto``).
        predicted_tau: τ_n(K) predicted from its measured acceptance.
        predicted_speedup: S(n, K) = τ_n(K) / (r(K + 1) + K·c_n).
        candidates: every sub-network as ``layers``, ``cost`` (c_n), ``accept`` (a_n per position), ``k``, ``tau`` and
            ``speedup`` (at its best K).
        ratios: the target's r(m) they were predicted with (verified tokens -> r).
    """

    layers: int
    k: int
    predicted_tau: float
    predicted_speedup: float
    candidates: list[dict]
    ratios: dict[int, float]

    def to_dict(self) -> dict:
        """As a score row saves it (rounded)."""
        rounded = [
            {key: (round(v, 5) if isinstance(v, float) else [round(a, 5) for a in v] if key == "accept" else v)
             for key, v in c.items()}
            for c in self.candidates
        ]  # fmt: skip
        return {
            "layers": self.layers,
            "k": self.k,
            "predicted_tau": round(self.predicted_tau, 4),
            "predicted_speedup": round(self.predicted_speedup, 4),
            "candidates": rounded,
            "ratios": {m: round(r, 5) for m, r in self.ratios.items()},
        }


def pick_exit(
    profiles: dict[int, tuple[Sequence[float], float]], ratios: dict[int, float], ks: Iterable[int]
) -> ExitChoice:
    """The sub-network of highest predicted speed: for each depth n, its best K of ``ks`` by
    ``auto_k.choose_chain_k``; then the n whose speed is highest (ties to the shallower).

    Args:
        profiles: depth -> (conditional acceptance a_1.. per position, cost c per drafted token in decode steps).
        ratios: the target's measured verification cost, verified tokens -> r (r(1) = 1).
        ks: draft lengths to consider (one: the run's fixed K).
    """
    ks = list(ks)
    candidates = []
    for layers in sorted(profiles):
        accept, cost = profiles[layers]
        best = auto_k.choose_chain_k(accept, ratios, cost, ks)
        candidates.append({"layers": layers, "cost": cost, "accept": list(accept), "k": best.k,
                           "tau": best.predicted_tau, "speedup": best.predicted_speedup})  # fmt: skip
    top = max(c["speedup"] for c in candidates)
    chosen = next(c for c in candidates if c["speedup"] >= top * (1 - TIE))
    return ExitChoice(chosen["layers"], chosen["k"], chosen["tau"], chosen["speedup"], candidates, dict(ratios))


def calibrate(
    target: Target, drafter: S2DDrafter, prompts: Sequence[list[int]], sampling: Sampling, k: int, seed: int = 0
) -> dict[int, tuple[list[float], float]]:
    """Each sub-network's (acceptance per position, cost per drafted token in decode steps), pooled over one decode
    of each of ``prompts`` at ``k`` tokens per round, drafted as a chain; the drafter is left drafting with its
    deepest."""
    tree = drafter.tree
    if tree.kind is not TreeKind.CHAIN:
        drafter.set_tree(replace(tree, kind=TreeKind.CHAIN), k)
    seeded = lambda: torch.Generator().manual_seed(seed)  # noqa: E731
    plain_decode(target, prompts[0], 8, sampling, seeded())  # warm-up
    plains = [plain_decode(target, p, CALIBRATION_TOKENS // 2, sampling, seeded()) for p in prompts]
    step = sum(p.seconds for p in plains) / max(1, sum(p.target_calls for p in plains))
    profiles = {}
    for layers in drafter.subnetworks:
        drafter.use(layers)
        decoder = SpeculativeDecoder(target, drafter, k, sampling)
        decoder.generate(prompts[0], 8, seeded())  # warm-up
        results = [decoder.generate(p, CALIBRATION_TOKENS, seeded()) for p in prompts]
        cost = sum(r.draft_seconds for r in results) / max(1, sum(sum(r.drafted) for r in results)) / step
        metrics = drafter_metrics(f"L{layers}", k, results, plains, sampling.greedy)
        profiles[layers] = (metrics.accept_given_reached, cost)
    drafter.use(max(drafter.subnetworks))
    if tree.kind is not TreeKind.CHAIN:
        drafter.set_tree(tree, k)
    return profiles


def choose_exits(
    targets: dict[str, Target],
    drafters: dict[str, Drafter],
    prompts: Sequence[list[int]],
    sampling: Sampling,
    seed: int,
    ks: Iterable[int],
    verify_ratios: Callable[[Target, list[int], list[int], int], tuple[dict[int, float], float]],
) -> dict[str, ExitChoice]:
    """For each sorted draft LM of ``drafters``, the sub-network of highest predicted speed on its target
    (``targets[name]``) at the best of draft lengths ``ks`` (the run's K, or 1..8 for ``--k auto``), measured on
    ``prompts`` (the calibration prompts; r(m) on the first); each such drafter is left drafting with it, the choice recorded for its row (``S2DDrafter.choice``).
    ``verify_ratios``: ``eval.calibration.verify_ratios``, which measures r(m)."""
    ks = list(ks)
    chosen = {}
    for name, drafter in drafters.items():
        if not isinstance(drafter, S2DDrafter):
            continue
        ratios, _ = verify_ratios(targets[name], prompts[0], [n + 1 for n in ks], 3)
        profiles = calibrate(targets[name], drafter, prompts, sampling, max(ks), seed)
        choice = pick_exit(profiles, ratios, ks)
        drafter.use(choice.layers)
        drafter.choice = choice.to_dict()
        chosen[name] = choice
    return chosen
