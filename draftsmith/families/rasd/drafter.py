"""RASD (Quan et al. 2025): retrieval candidates fused with a model drafter's tree into one verification tree.

Each round the wrapped ``TreeDrafter`` (EAGLE-1/3, P-EAGLE, Medusa/Hydra, a draft LM, ...) drafts its tree as it
would alone (chain, static, dynamic or sampled); retrieval then proposes what followed the context's longest
matching suffix, from the prompt and the text generated so far (``ContextIndex``: every earlier occurrence) and
from a datastore (``SuffixIndex``), most frequent first; candidates whose first token is outside the drafter's
``prune_top_k`` most likely first tokens are dropped; the rest are merged into the drafter's tree by longest prefix
matching (``fuse``): a retrieval path walks down the tree while its tokens match and hangs its remainder off the
deepest matching node, so siblings stay distinct tokens, until ``nodes`` retrieval nodes are added.

Exact and lossless: retrieval nodes are deterministic given the context and the drafter's tree, so their q is a
point mass (a one-hot row beside the drafter's q rows, or ``q=None`` when the drafter's tree is deterministic too),
and the verifier tries them after every drafted candidate of their node (``core.trees``: candidates in node order,
repeated candidates' children included, retrieved nodes appended last); its multi-candidate rule tries each child
against the residual left by the ones before, which stays lossless for any candidate drawn from the q it reports
given everything tried before it. Retrieval time is part of ``propose``, so the verifier counts it in the
drafter's cost c.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from draftsmith.core.draft import DecodeResult, Draft
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.core.trees import representatives
from draftsmith.errors import DraftsmithError
from draftsmith.families.rasd.retrieval import ContextIndex, SuffixIndex
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy


@dataclass
class RasdState:
    """The wrapped drafter's state, the context's n-gram index, and the last fused draft (for the statistics)."""

    inner: Any
    context: ContextIndex
    last: tuple[list[int], list[int], list[bool]] = field(default_factory=lambda: ([], [], []))
    """(tokens, parents, retrieved) of the last fused draft; retrieved[i]: node i came from retrieval."""


def fuse(draft: Draft, paths: list[list[int]], budget: int) -> tuple[Draft, list[bool]]:
    """Merge retrieval ``paths`` into ``draft`` by longest prefix matching, adding at most ``budget`` nodes.

    A path follows the tree while a node carries its next token among its children (a repeated candidate's copies
    count as one node, as the verifier merges them: ``core.trees.representatives``) and adds its remaining tokens below the deepest match, after that node's existing
    children. Added nodes are point masses: one-hot q rows when ``draft`` has q rows.

    Returns:
        (the fused draft, per node whether retrieval added it).
    """
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    rep = representatives(tokens, parents)  # repeated candidates (i.i.d. siblings) are one node to the verifier
    child = {(p if p < 0 else rep[p], t): rep[i] for i, (t, p) in enumerate(zip(tokens, parents, strict=True))}
    added = 0
    for path in paths:
        node = -1
        for t in path:
            if (node, t) not in child:
                if added == budget:
                    break
                child[node, t] = len(tokens)
                tokens.append(t)
                parents.append(node)
                added += 1
            node = child[node, t]
    retrieved = [i >= len(draft) for i in range(len(tokens))]
    q = draft.q
    if q is not None and added:
        rows = torch.zeros(added, q.shape[1], dtype=q.dtype, device=q.device)
        rows[torch.arange(added), torch.tensor(tokens[len(draft) :])] = 1.0
        q = torch.cat([q, rows])
    fused = Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), q)
    return fused, retrieved


@contextmanager
def _recording_root(drafter: TreeDrafter) -> Iterator[list[torch.Tensor]]:
    """Within the block, the logits every ``drafter.root`` call returns (what pruning reads: the drafter's own
    first-token distribution, without a second forward); the instance's ``root`` is shadowed for the block only."""
    seen: list[torch.Tensor] = []
    root = drafter.root

    def recording(state):
        scratch, logits = root(state)
        seen.append(logits)
        return scratch, logits

    drafter.root = recording
    try:
        yield seen
    finally:
        del drafter.root


class RasdDrafter(TreeDrafter):
    """Any tree drafter with retrieval candidates fused into its tree (see the module's docstring).

    Args:
        inner: the model drafter; its tree policy is this drafter's (``set_tree`` sets it).
        datastore: a corpus index (``draftsmith datastore``), or None.
        context: whether to retrieve from the prompt and the generated text.
        nodes: retrieval nodes added per round at most (the fused tree holds the drafter's nodes + these; 0: the
            drafter alone, as ``families.rasd.budget.choose_nodes`` measures it).
        max_ngram: longest context suffix matched (shorter ones are tried next, down to one token).
        prune_top_k: keep a retrieval path only when its first token is among the drafter's this many most likely
            first tokens (0: keep every path).
        length: deepest retrieval path (None: the round's K).
        depth: the model drafter's depth per round (None: the round's K). Below the round's K, the model drafts as
            deep as it pays alone and retrieval's paths, nearly free per node, go on to K below its nodes.
    """

    def __init__(
        self,
        inner: TreeDrafter,
        datastore: SuffixIndex | None = None,
        context: bool = True,
        nodes: int = 16,
        max_ngram: int = 4,
        prune_top_k: int = 8,
        length: int | None = None,
        depth: int | None = None,
    ) -> None:
        if not isinstance(inner, TreeDrafter):
            raise DraftsmithError(
                f"rasd: fuses retrieval into a tree drafter's tree (EAGLE, Medusa, Hydra, the parallel drafters, "
                f"draft LMs), not a {type(inner).__name__}"
            )
        if datastore is None and not context:
            raise DraftsmithError("rasd: no retrieval source: give a datastore or keep context retrieval on")
        if nodes < 0 or max_ngram < 1 or prune_top_k < 0 or any(x is not None and x < 1 for x in (length, depth)):
            raise DraftsmithError(
                f"rasd: ngram, length and depth must be positive, nodes and prune >= 0, got nodes={nodes}, "
                f"ngram={max_ngram}, prune={prune_top_k}, length={length}, depth={depth}"
            )
        self.inner, self.datastore, self.context = inner, datastore, context
        self.nodes, self.max_ngram, self.prune_top_k, self.length = nodes, max_ngram, prune_top_k, length
        self.depth = depth
        self.vocab_size, self.tokenizer_hash = inner.vocab_size, inner.tokenizer_hash
        self.needs_features, self.feature_layers, self.own_target = (
            inner.needs_features,
            inner.feature_layers,
            inner.own_target,
        )
        self.reset_stats()

    def reset_stats(self) -> None:
        """Start counting ``stats`` anew (``extra_metrics`` does too)."""
        self.stats = {"rounds": 0, "retrieval_seconds": 0.0, "retrieved": 0, "accepted": 0, "accepted_retrieved": 0}
        """Since the last reset: rounds, seconds spent retrieving, retrieval nodes added, draft tokens accepted and
        of those the ones retrieval added."""

    @property
    def tree(self) -> TreePolicy:
        """The wrapped drafter's tree policy."""
        return self.inner.tree

    @tree.setter
    def tree(self, policy: TreePolicy) -> None:
        self.inner.tree = policy

    @property
    def max_depth(self) -> int | None:
        return None  # retrieval paths may run deeper than the drafter drafts

    @property
    def topk_accuracy(self) -> list[list[float]] | None:
        return self.inner.topk_accuracy

    def set_tree(self, policy: TreePolicy, k: int) -> None:
        self.inner.set_tree(policy, k)

    def bind(self, target: Any) -> None:
        self.inner.bind(target)

    def compile(self) -> None:
        self.inner.compile()

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> RasdState:
        context = ContextIndex(self.max_ngram)
        context.extend(tokens.tolist())
        return RasdState(self.inner.begin(tokens, target_out), context)

    def root(self, state: RasdState) -> tuple[Any, torch.Tensor]:
        return self.inner.root(state.inner)

    def grow(self, state: RasdState, scratch: Any, tokens, parents, new) -> torch.Tensor:
        return self.inner.grow(state.inner, scratch, tokens, parents, new)

    def retrieve(self, state: RasdState, length: int) -> list[list[int]]:
        """Candidate paths of up to ``length`` tokens: the context's first, then the datastore's."""
        paths = state.context.lookup(length, self.nodes) if self.context else []
        if self.datastore is not None:
            paths += self.datastore.lookup(state.context.ids, length, self.nodes, self.max_ngram)
        return paths

    def prune(self, paths: list[list[int]], first: torch.Tensor | None) -> list[list[int]]:
        """The paths whose first token is among the ``prune_top_k`` highest of ``first`` (the drafter's logits of
        its first drafted token; None, a round that drafted nothing: no pruning)."""
        if not self.prune_top_k or first is None:
            return paths
        top = set(first.topk(min(self.prune_top_k, first.shape[-1])).indices.tolist())
        return [p for p in paths if p[0] in top]

    @torch.no_grad()
    def propose(self, state: RasdState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        with _recording_root(self.inner) as seen:
            draft = self.inner.propose(state.inner, min(k, self.depth or k), sampling, generator)
        if len(draft) and not seen:  # every tree drafter's propose reads its first logits from ``root``
            raise DraftsmithError(f"rasd: {type(self.inner).__name__} drafted without its first-token logits (root)")
        start = time.perf_counter()
        first = seen[0] if seen else None
        paths = self.prune(self.retrieve(state, min(k, self.length or k)), first)
        fused, retrieved = fuse(draft, paths, self.nodes)
        self.stats["rounds"] += 1
        self.stats["retrieved"] += sum(retrieved)
        self.stats["retrieval_seconds"] += time.perf_counter() - start
        state.last = (fused.tokens.tolist(), fused.parents.tolist(), retrieved)
        return fused

    def advance(self, state: RasdState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        committed = tokens.tolist()
        draft_tokens, parents, retrieved = state.last
        members = [-1]  # the accepted node's copies (the verifier walks repeated candidates as one class)
        for t in committed[:-1]:  # the accepted draft tokens; the last is the target's own
            members = [i for i, (d, p) in enumerate(zip(draft_tokens, parents, strict=True)) if p in members and d == t]
            self.stats["accepted"] += 1
            self.stats["accepted_retrieved"] += retrieved[members[0]]
        state.last = ([], [], [])
        state.context.extend(committed)
        self.inner.advance(state.inner, tokens, target_out)

    def extra_metrics(self, results: list[DecodeResult]) -> dict:
        """Retrieval's share of the rounds: nodes added and latency per round, and of the accepted draft tokens the
        share retrieval added (counted since the last call)."""
        s, rounds = self.stats, max(1, self.stats["rounds"])
        out = {
            "retrieval_nodes_per_round": s["retrieved"] / rounds,
            "retrieval_ms_per_round": 1000 * s["retrieval_seconds"] / rounds,
            "accepted_from_retrieval": s["accepted_retrieved"] / max(1, s["accepted"]),
        }
        self.reset_stats()
        return {**self.inner.extra_metrics(results), **out}
