"""``--k auto``'s measurements on this machine: r(m), what verifying m tokens costs in decode steps
(``verify_ratios``), each drafter's cost c and, where it has no recorded validation profile, its acceptance, from
untimed decodes of the first held-out prompts; from them, each drafter's shape (K, static tree size, RASD's fused
retrieval) of highest predicted speed by ``decode.auto_k``'s cost model (``choose_shapes``). ``score`` shapes its
drafters here before its scored pass; the pipeline's sizing times a target's decode step with ``verify_ratios``."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from draftsmith.core.draft import Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, rollback
from draftsmith.core.trees import TreeKind
from draftsmith.decode import auto_k
from draftsmith.decode.metrics import drafter_metrics
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.rasd import budget as rasd
from draftsmith.families.rasd.drafter import RasdDrafter
from draftsmith.layers.tree_draft import TreeDrafter

AUTO_K = "auto"
AUTO_MAX_K = 8
"""``--k auto`` searches chains of 1..8 tokens (and static trees of up to 64 nodes)."""
CALIBRATION_PROMPTS = 3
"""Prompts ``--k auto`` profiles a drafter's acceptance on where it has no recorded validation profile: one prompt
whose every draft was accepted (τ 9.00 at K = 8 on the quickstart's first prompt, 2.51 over its ten) sent the
draft LM, the n-gram and the sibling to K = 8."""


def most_verified(drafter: Drafter, k: int) -> int:
    """The most tokens one verification forward of ``drafter``'s rounds holds (its drafts + 1)."""
    from draftsmith.families.ngram.drafter import NGramDrafter

    if isinstance(drafter, RasdDrafter):
        return most_verified(drafter.inner, min(k, drafter.depth or k)) + drafter.nodes
    if isinstance(drafter, TreeDrafter) and drafter.tree.kind is TreeKind.SAMPLED:
        return drafter.tree.sampled_nodes(k) + 1
    if isinstance(drafter, TreeDrafter) and drafter.tree.kind is not TreeKind.CHAIN:
        return drafter.tree.size + 1
    if isinstance(drafter, NGramDrafter):
        return k * drafter.width + 1
    return k + 1


def choose_shapes(
    targets: dict[str, Target],
    drafters: dict[str, Drafter],
    prompt: list[int],
    sampling: Sampling,
    seed: int,
    more: Sequence[list[int]] = (),
) -> dict[str, auto_k.Shape]:
    """Each drafter's K (and static tree size) of highest predicted speed τ(K) / (r(K+1) + K·c) on this machine.

    Untimed decodes at K = 8 of ``prompt`` and the ``more`` prompts (``score`` passes the next held-out ones, up to
    ``CALIBRATION_PROMPTS`` in all) measure each drafter's cost c and, for a drafter with no recorded validation
    profile, its per-position acceptance; r(m) is measured on ``prompt``. The choice itself is ``decode.auto_k``'s.
    A RASD drafter is shaped so with no retrieval nodes (its lookups still timed), then its fused tree's retrieval
    budget chosen (``fused_nodes``).
    """
    shapes = {}
    counts = [*range(2, AUTO_MAX_K + 2), *(n + 1 for n in auto_k.TREE_SIZES)]
    for name, drafter in drafters.items():
        target = targets[name]
        if isinstance(drafter, RasdDrafter):
            drafter.nodes, drafter.depth = 0, None  # the model drafter alone, at every depth
        ratios, _ = verify_ratios(target, prompt, counts, 3)
        tree = drafter.tree if isinstance(drafter, TreeDrafter) else None
        if tree is not None:  # calibrate as a chain: one drafter forward per drafted token
            drafter.set_tree(replace(tree, kind=TreeKind.CHAIN), AUTO_MAX_K)
        decoder = SpeculativeDecoder(target, drafter, AUTO_MAX_K, sampling)
        runs = [decoder.generate(p, 64, torch.Generator().manual_seed(seed)) for p in [prompt, *more]]
        plains = [plain_decode(target, p, 16, sampling, torch.Generator().manual_seed(seed)) for p in [prompt, *more]]
        step = sum(p.seconds for p in plains) / sum(p.target_calls for p in plains)
        cost = sum(r.draft_seconds for r in runs) / max(1, sum(sum(r.drafted) for r in runs)) / step
        # an adaptive drafter (one that cuts its own drafts) is profiled as it drafts, as K is only its cap
        accuracy = None if getattr(drafter, "adaptive", False) else getattr(drafter, "topk_accuracy", None)
        if accuracy:
            accept, source = [row[0] for row in accuracy], "validation"
        else:
            metrics = drafter_metrics(name, AUTO_MAX_K, runs, plains, sampling.greedy)
            accept, source = metrics.accept_given_reached, "calibration"
        if tree is not None and tree.kind is TreeKind.STATIC and accuracy:
            choice = auto_k.choose_tree(accuracy, ratios, cost, max_depth=AUTO_MAX_K)
            drafter.set_tree(replace(tree, size=choice.tree_size, paths=()), choice.k)
        else:
            choice = auto_k.choose_chain_k(accept, ratios, cost, ks=range(1, AUTO_MAX_K + 1))
            if tree is not None:
                drafter.set_tree(replace(tree, paths=()), choice.k)
        shapes[name] = auto_k.Shape.of(choice, cost, source)
        if isinstance(drafter, RasdDrafter):
            shapes[name] = fused_nodes(target, drafter, prompt, sampling, seed, shapes[name])
    return shapes


def fused_nodes(
    target: Target, drafter: RasdDrafter, prompt: list[int], sampling: Sampling, seed: int, shape: auto_k.Shape
) -> auto_k.Shape:
    """``shape`` (the model drafter's) with the fused tree's depth and retrieval budget of highest predicted speed
    τ / (r(m) + C), C the drafter's time per round with retrieval's (``families.rasd.budget.choose_fused``), r(m) measured up
    to the widest fused tree; the drafter is left set to them. The model drafts at the K chosen for it alone
    (``RasdDrafter.depth``: as deep as its own drafts pay); retrieval's paths, nearly free per node, may go deeper,
    to the fused K chosen among the model's K, 4 and 8 (the n-gram copies long runs where the text repeats)."""
    drafter.depth = shape.k
    depths = sorted({shape.k, AUTO_MAX_K // 2, AUTO_MAX_K})
    counts = {most_verified(drafter.inner, min(k, shape.k)) + n for k in depths for n in rasd.BUDGETS}
    ratios, step = verify_ratios(target, prompt, sorted(counts), 3)
    choice = rasd.choose_fused(target, drafter, prompt, depths, sampling, ratios, step, seed=seed)
    return replace(
        shape,
        k=choice.k,
        predicted_tau=choice.predicted_tau,
        predicted_speedup=choice.predicted_speedup,
        nodes=choice.nodes,
        nodes_candidates=choice.candidates,
        model_depth=drafter.depth,
    )


@torch.no_grad()
def verify_ratios(
    target: Target, prompt: list[int], counts: list[int], repeats: int = 7
) -> tuple[dict[int, float], float]:
    """r(m): the median time of a target forward of m new tokens over that of 1 token, on the same cached context
    (the prompt), interleaved: what verifying a round of m - 1 drafted tokens costs in decode steps.

    Returns:
        ({m: r(m)} for m in ``counts`` and 1, the median seconds of the 1-token forward).
    """
    cache = target.new_cache()
    target(torch.tensor([prompt]), cache, with_features=False)
    n = cache.get_seq_length()
    times: dict[int, list[float]] = {m: [] for m in sorted({1, *counts})}
    for _ in range(repeats):
        for m in times:
            ids = torch.tensor([prompt[-1:] * m])
            start = time.perf_counter()
            target(ids, cache, with_features=False).logits[0, -1, 0].item()  # waits for a GPU's queued kernels
            times[m].append(time.perf_counter() - start)
            rollback(cache, n)
    step = statistics.median(times[1])
    return {m: statistics.median(t) / step for m, t in times.items()}, step
