"""Drafting token trees: chains, static trees (Medusa) and dynamic trees (EAGLE-2) over one primitive.

A ``TreeDrafter`` says two things: the distribution of the first drafted token (``root``) and,
for freshly added nodes (all at one depth), the distribution of each one's child (``grow``).
From these, ``propose`` builds:

- a **chain** (no policy): draw or take the argmax at each depth, recording q (lossless with
  any sampling rule);
- a **static tree**: a fixed set of rank paths, e.g. (0,), (1,), (0, 0): "the top-1 token, the
  top-2 token, the top-1 child of the top-1 token" (Medusa's sparse trees), built by
  ``static_tree`` from per-depth top-k accuracies measured on held-out data;
- a **dynamic tree** (EAGLE-2): at each depth expand the ``top_k`` nodes with the highest
  cumulative draft confidence (product of the drafter's probabilities along the path) into
  their ``top_k`` children, then keep the ``size`` most confident nodes overall;
- a **sampled tree** (multi-draft: SpecInfer, SpecTr, RSD-C): every node at depth d gets
  ``branching[d]`` children drawn from the drafter's distribution, i.i.d. or without replacement,
  each recording the row it was drawn from (what the verifier's rule needs to stay lossless); a
  candidate drawn twice is grown once (its repeats' children are drawn from its row, and the
  verifier merges such nodes: ``core.trees``);
- a **beam tree** (RSD-S, Jeon et al. 2024): stochastic beam search (Kool et al. 2019) keeps the
  ``beam_width`` paths of highest Gumbel-perturbed log-probability at each depth, so a node's
  children are a prefix of a draw without replacement from its distribution, as many as won a
  place in the beam; siblings are listed in draw order with the rows RSD's rule needs.

Static and dynamic tree tokens are chosen deterministically (top ranks), so their q is a point
mass (``q=None``): the verifier's multi-candidate rule then stays lossless under sampling.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling, draw_candidates, probs, remainder, sample
from draftsmith.core.trees import TreeKind, representatives
from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class TreePolicy:
    """How a ``TreeDrafter`` shapes its drafts.

    Attributes:
        kind: chain, static, dynamic, sampled or beam tree (``TreeKind``; ``TreeKind.parse`` reads ``--tree``).
        size: tree nodes (drafted tokens) per round, for trees.
        top_k: dynamic trees: nodes expanded per depth and children per expanded node.
        paths: static trees: rank paths, parents before children (see ``static_tree``).
        branching: sampled trees: children drawn per node at each depth (its length caps the depth).
        replacement: sampled trees: siblings drawn i.i.d. (True) or without replacement (RSD).
        beam_width: beam trees (RSD-S): paths kept per depth (at most ``beam_width`` nodes per depth).
    """

    kind: TreeKind = TreeKind.CHAIN
    size: int = 16
    top_k: int = 4
    paths: tuple[tuple[int, ...], ...] = ()
    branching: tuple[int, ...] = (2, 2, 1, 1)
    replacement: bool = True
    beam_width: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.kind, TreeKind):
            raise TypeError(f"TreePolicy.kind is a TreeKind (TreeKind.parse reads --tree), got {self.kind!r}")
        if self.size <= 0 or self.top_k <= 0 or self.beam_width <= 0:
            raise DraftsmithError(
                f"--tree_size, --tree_top_k and --tree_beam_width must be positive, got {self.size}, {self.top_k} "
                f"and {self.beam_width}"
            )
        if not self.branching or any(b <= 0 for b in self.branching):
            raise DraftsmithError(f"--tree_branching must be positive integers, got {list(self.branching)}")

    def sampled_nodes(self, depth: int) -> int:
        """Nodes of a full sampled tree cut at ``depth``: sum over its depths of the product of the branchings."""
        total, width = 0, 1
        for b in self.branching[:depth]:
            width *= b
            total += width
        return total


def static_tree(accuracy: list[list[float]], size: int, max_depth: int) -> tuple[tuple[int, ...], ...]:
    """The ``size`` rank paths of highest expected acceptance, prefix-closed (Medusa's sparse tree).

    A path (r_1, .., r_d) means "the rank-r_1 token at depth 1, then its rank-r_2 child, ...";
    its value is prod_j accuracy[j][r_j], the chance the target's token at every depth j is the
    drafter's rank-r_j choice (treating depths as independent, as Medusa does). A child is never
    worth more than its parent, so taking paths best-first keeps the set prefix-closed.

    Args:
        accuracy: accuracy[d][r] = P(the target's token at depth d+1 is the drafter's rank r),
            measured on held-out data.
        size: number of paths (tree nodes).
        max_depth: deepest depth allowed.
    """
    depth = min(max_depth, len(accuracy))
    if depth == 0 or not accuracy[0]:
        raise DraftsmithError("a static tree needs measured top-k accuracies, and none were recorded")
    heap = [(-accuracy[0][r], (r,)) for r in range(len(accuracy[0]))]
    heapq.heapify(heap)
    paths = []
    while heap and len(paths) < size:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < depth:
            for r, acc in enumerate(accuracy[len(path)]):
                heapq.heappush(heap, (neg * acc, (*path, r)))
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@dataclass
class FeatureState:
    """A feature drafter's state over one sequence (EAGLE, Hydra, Clover): the committed tokens, the target's features
    for them, and the keys/values of the rows its own attention layer has processed."""

    tokens: list[int]
    features: torch.Tensor
    """(len(tokens) - 1, H) target features (EAGLE: fused); row i predicted tokens[i + 1]."""
    past_k: torch.Tensor | None = None
    past_v: torch.Tensor | None = None
    """Keys/values of the rows processed with real target features (EAGLE's layer, Hydra++'s prefix layer)."""

    @property
    def cached(self) -> int:
        return 0 if self.past_k is None else self.past_k.shape[2]

    def commit(self, tokens: torch.Tensor, features: torch.Tensor) -> None:
        """Append committed ``tokens`` and the target's features for them (the drafter's ``advance``)."""
        self.tokens.extend(tokens.tolist())
        self.features = torch.cat([self.features, features])


class TreeDrafter(Drafter):
    """A drafter that can grow token trees. Subclasses implement ``root`` and ``grow``.

    Attributes:
        tree: the drafting policy (chain by default); ``draftsmith score --tree`` sets it.
        max_depth: deepest draft the drafter can make (Medusa/Hydra: its head count), or None.
        topk_accuracy: per depth, the accuracy of each rank, measured on held-out data when it
            was trained (what static trees are built from), or None.
        hidden_in_scratch: whether the scratch of ``root``/``grow`` keeps each drafted node's output hidden state
            (``scratch.hidden[node]``, (1, 1, H); EAGLE's drafters), which SpecDec++'s acceptance head reads.
    """

    tree: TreePolicy = TreePolicy()
    max_depth: int | None = None
    topk_accuracy: list[list[float]] | None = None
    hidden_in_scratch: bool = False

    @abstractmethod
    def root(self, state: Any) -> tuple[Any, torch.Tensor]:
        """Begin a round: (scratch for ``grow``, (V,) logits of the first drafted token). Every ``propose`` that
        drafts a token reads its first token's logits here, once (RASD's pruning records them)."""

    @abstractmethod
    def grow(self, state: Any, scratch: Any, tokens: list[int], parents: list[int], new: list[int]) -> torch.Tensor:
        """(len(new), V) logits of the child of each node in ``new`` (node indices, all at one depth)."""

    def set_tree(self, policy: TreePolicy, k: int) -> None:
        """Use ``policy`` for drafts of depth <= k; a static tree is built from ``topk_accuracy``."""
        if policy.kind is TreeKind.STATIC and not policy.paths:
            if not self.topk_accuracy:
                raise DraftsmithError(
                    "--tree static needs the drafter's measured top-k accuracies (recorded by `draftsmith fit` "
                    "for head and EAGLE drafters); this drafter has none: use --tree dynamic"
                )
            depth = min(k, self.max_depth or k)
            paths = static_tree(self.topk_accuracy, policy.size, depth)
            policy = TreePolicy(TreeKind.STATIC, len(paths), policy.top_k, paths)
        self.tree = policy

    def _depth(self, k: int) -> int:
        return min(k, self.max_depth) if self.max_depth else k

    @torch.no_grad()
    def propose(self, state: Any, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        k = self._depth(k)
        if k <= 0:
            return Draft.empty()
        if self.tree.kind is TreeKind.CHAIN:
            return self._chain(state, k, sampling, generator)
        if self.tree.kind is TreeKind.STATIC:
            return self._static(state, k)
        if self.tree.kind is TreeKind.SAMPLED:
            return self._sampled(state, k, sampling, generator)
        if self.tree.kind is TreeKind.BEAM:
            return self._beam(state, k, sampling, generator)
        return self._dynamic(state, k)

    def _chain(self, state, k: int, sampling: Sampling, generator) -> Draft:
        scratch, logits = self.root(state)
        tokens, parents, qs = [], [], []
        for i in range(k):
            q = probs(logits.float(), sampling)
            tokens.append(int(q.argmax()) if sampling.greedy else sample(q, generator))
            parents.append(i - 1)
            qs.append(q)
            if i < k - 1:
                logits = self.grow(state, scratch, tokens, parents, [i])[0]
        return Draft.chain(tokens, torch.stack(qs))

    def _sampled(self, state, k: int, sampling: Sampling, generator) -> Draft:
        _needs_sampling(sampling, TreeKind.SAMPLED)
        scratch, logits = self.root(state)
        tokens, parents, rows = [], [], []
        frontier = [(-1, logits)]
        depth_limit = min(k, len(self.tree.branching))
        for depth in range(depth_limit):
            new = []
            for node, node_logits in frontier:
                q = probs(node_logits.float(), sampling)
                drawn, drawn_rows = draw_candidates(q, self.tree.branching[depth], self.tree.replacement, generator)
                for token, row in zip(drawn, drawn_rows, strict=True):
                    new.append(len(tokens))
                    tokens.append(token)
                    parents.append(node)
                    rows.append(row)
            if depth + 1 < depth_limit:  # a candidate drawn twice is grown once: its repeats share its row
                rep = representatives(tokens, parents)
                grown = [i for i in new if rep[i] == i]
                through = [p if p < 0 else rep[p] for p in parents]  # grown nodes' ancestors: grown nodes only
                logits = dict(zip(grown, self.grow(state, scratch, tokens, through, grown), strict=True))
                frontier = [(i, logits[rep[i]]) for i in new]
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), torch.stack(rows))

    def _beam(self, state, k: int, sampling: Sampling, generator) -> Draft:
        """Stochastic beam search: each depth's candidates are every beam node's children, perturbed with Gumbel
        noise conditioned on their parent's perturbed value (so a path's value is a Gumbel-perturbed log-probability
        of the whole path); the ``beam_width`` highest are kept. A node's kept children are its highest-perturbed
        ones, i.e. the first draws of a sampling without replacement (Gumbel-top-k), listed in that order, each with
        its distribution minus its earlier siblings, renormalised (the rows of ``draw_candidates``)."""
        _needs_sampling(sampling, TreeKind.BEAM)
        width = self.tree.beam_width
        scratch, logits = self.root(state)
        tokens, parents, rows = [], [], []
        beams = [(-1, 0.0, 0.0, logits)]  # (node, log-prob of its path, its perturbed value, its child's logits)
        for depth in range(k):
            candidates = []  # (perturbed value, parent, token, log-prob of the path, parent's q)
            for node, logp, value, node_logits in beams:
                q = probs(node_logits.float(), sampling)
                path_logp = logp + q.log()  # -inf outside q's support
                perturbed = _conditioned_gumbels(path_logp, value, generator)
                top = perturbed.topk(min(width, int((q > 0).sum())))
                candidates += [
                    (float(v), node, int(t), float(path_logp[t]), q)
                    for v, t in zip(top.values, top.indices, strict=True)
                ]
            kept = draw_order(sorted(candidates, key=lambda c: -c[0])[:width])
            new, siblings = [], {}
            for _, parent, token, _, q in kept:
                rows.append(remainder(q, siblings.setdefault(parent, [])))
                siblings[parent].append(token)
                new.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
            if depth + 1 < k:
                grown = self.grow(state, scratch, tokens, parents, new)
                beams = [(i, c[3], c[0], row) for i, c, row in zip(new, kept, grown, strict=True)]
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), torch.stack(rows))

    def _static(self, state, k: int) -> Draft:
        paths = [p for p in self.tree.paths if len(p) <= k]
        scratch, logits = self.root(state)
        index: dict[tuple[int, ...], int] = {}
        tokens, parents = [], []
        frontier_logits = {(): logits}
        for depth in range(1, k + 1):
            level = [p for p in paths if len(p) == depth]
            if not level:
                break
            for p in level:
                parent_logits = frontier_logits.get(p[:-1])
                if parent_logits is None:  # its parent did not make the cut at this k
                    continue
                ranks = parent_logits.topk(p[-1] + 1).indices
                index[p] = len(tokens)
                tokens.append(int(ranks[p[-1]]))
                parents.append(index[p[:-1]] if depth > 1 else -1)
            grow = [p for p in index if len(p) == depth and any(c[:-1] == p for c in paths if len(c) == depth + 1)]
            if grow and depth < k:
                out = self.grow(state, scratch, tokens, parents, [index[p] for p in grow])
                frontier_logits = dict(zip(grow, out, strict=True))
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), None)

    def _dynamic(self, state, k: int) -> Draft:
        top_k, size = self.tree.top_k, self.tree.size
        scratch, logits = self.root(state)
        tokens, parents, scores = [], [], []  # scores: cumulative log-confidence of each node
        frontier = [(-1, 0.0, logits)]  # (node, its score, logits of its child)
        for depth in range(1, k + 1):
            candidates = []
            for node, score, node_logits in frontier:
                logp = torch.log_softmax(node_logits.float(), -1)
                top = logp.topk(min(top_k, len(logp)))
                candidates += [(score + float(v), node, int(t)) for v, t in zip(top.values, top.indices, strict=True)]
            new = []
            for score, parent, token in candidates:
                new.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
                scores.append(score)
            if depth == k:
                break
            expand = sorted(new, key=lambda i: -scores[i])[:top_k]
            out = self.grow(state, scratch, tokens, parents, expand)
            frontier = [(i, scores[i], row) for i, row in zip(expand, out, strict=True)]
        return _rerank(tokens, parents, scores, size)


def draw_order(kept: list[tuple]) -> list[tuple]:
    """A beam depth's kept (perturbed value, parent, token, ...) in tree order: parents in node order, and each
    node's children by falling perturbed value, the order in which a sampling without replacement drew them."""
    return sorted(kept, key=lambda c: (c[1], -c[0]))


def _needs_sampling(sampling: Sampling, kind: TreeKind) -> None:
    if sampling.greedy:
        raise DraftsmithError(
            f"--tree {kind} draws candidates from the drafter's distribution: it needs --temperature > 0 "
            "(greedy verification follows the target's argmax, so use --tree dynamic or static there)"
        )


def _conditioned_gumbels(logp: torch.Tensor, top: float, generator) -> torch.Tensor:
    """Gumbel-perturbed ``logp`` (a node's children's path log-probs) conditioned on their maximum being ``top``, the
    node's own perturbed value (Kool et al. 2019, eq. 23, in its numerically stable form)."""
    u = torch.rand(logp.shape, generator=generator).clamp(1e-20, 1 - 1e-7)
    g = logp - torch.log(-torch.log(u))
    z = g.max()
    v = top - g + torch.log(-torch.expm1((g - z).clamp(max=-1e-30)))  # log(1 - exp(g - z))
    v = torch.where(g == z, torch.full_like(v, -torch.inf), v)
    return top - v.clamp_min(0) - torch.log1p(torch.exp(-v.abs()))


def _rerank(tokens: list[int], parents: list[int], scores: list[float], size: int) -> Draft:
    """Keep the ``size`` highest-scoring nodes (scores fall along every path, so the kept set is a
    tree), renumbered with parents first."""
    keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:size]
    keep.sort()  # original order is parents-first
    new_index = {old: new for new, old in enumerate(keep)}
    kept_parents = [new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    return Draft(
        torch.tensor([tokens[i] for i in keep], dtype=torch.long), torch.tensor(kept_parents, dtype=torch.long), None
    )
