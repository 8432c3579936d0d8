"""Token trees in the target's verification pass: attention mask, positions, and acceptance rules.

The verified sequence is [root, node_0 .. node_{N-1}]: the root is the last committed token
and node i's parent is ``parents[i]`` (-1 = root). Each node sits at position
``committed + depth`` and attends to the whole committed context, the root, its ancestors and
itself. Row r of the target's output predicts the child of sequence entry r.

Duplicate candidates are merged (SpecTr, Sun et al. 2023): nodes with the same token path (i.i.d.
siblings drawn twice) are one node to the target (``unique``), and the rules walk classes of such
nodes: a class's candidates are the children of all its members, in draw order, repeats included
(a repeat is another trial of the same token, which K-SEQ needs), and an accepted token leads to
the class of every candidate carrying it. Lossless: each member's children were drawn given the
token path alone, so together they are i.i.d. draws given it, whichever trial accepted the token.

The rules try a class's candidates in node order, which must be the order they were drawn in: each candidate is
verified with the q row it was really drawn from given everything tried before it. A node added after the draws
and only where they missed its token (RASD's retrieved nodes, point masses) is therefore tried after every drawn
candidate of its class, whichever member it hangs under: tried earlier, it would make the later members' children
draws conditioned on missing its token, verified with their unconditioned rows (not lossless). A point mass tried
after the draws is lossless whatever decided its presence: it is accepted with the residual's mass on its token, and
rejected leaves the residual without it, which together is a draw from the residual.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import torch

from draftsmith.core.sampling import one_hot, residual, sample, verify_kseq
from draftsmith.errors import DraftsmithError


def depths(parents: torch.Tensor) -> torch.Tensor:
    """(N,) depth of each node (a root child has depth 1); parents come before children."""
    out = torch.zeros(len(parents), dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        out[i] = 1 if p < 0 else out[p] + 1
    return out


def ancestry(parents: torch.Tensor) -> torch.Tensor:
    """(1+N, 1+N) bool: entry [a, b] is True when sequence entry b is a or an ancestor of a (root = 0)."""
    n = len(parents)
    seen = torch.eye(n + 1, dtype=torch.bool)
    seen[:, 0] = True
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            seen[i + 1] |= seen[p + 1]
    return seen


def attention_mask(parents: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, 1+N, past+1+N) additive mask: 0 where attending is allowed, the dtype's minimum elsewhere."""
    n = len(parents)
    allowed = torch.cat([torch.ones(n + 1, past, dtype=torch.bool), ancestry(parents)], dim=1)
    mask = torch.zeros(n + 1, past + n + 1, dtype=dtype)
    mask[~allowed] = torch.finfo(dtype).min
    return mask[None, None]


def positions(parents: torch.Tensor, past: int) -> torch.Tensor:
    """(1, 1+N) position ids: the root at ``past``, each node at ``past + depth``."""
    return (past + torch.cat([torch.zeros(1, dtype=torch.long), depths(parents)]))[None]


def children(parents: torch.Tensor) -> dict[int, list[int]]:
    """Node -> its children in order; the root is -1."""
    out: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        out.setdefault(p, []).append(i)
    return out


def representatives(tokens: list[int], parents: list[int]) -> list[int]:
    """Per node, the first node with the same token path (itself when it is the first); parents come first."""
    rep, first = [], {}
    for i, (t, p) in enumerate(zip(tokens, parents, strict=True)):
        rep.append(first.setdefault((p if p < 0 else rep[p], t), i))
    return rep


def unique(tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
    """The tree the target verifies, duplicates merged: (its nodes as indices of the drafted ones, per drafted node
    its index in that tree). Its parents: ``[index[parents[u]] for u in nodes]`` (-1 kept)."""
    rep = representatives(tokens, parents)
    nodes = [i for i, r in enumerate(rep) if r == i]
    where = {u: j for j, u in enumerate(nodes)}
    return nodes, [where[r] for r in rep]


class Walk:
    """A rule's walk down the tree over classes of nodes with the same token path (see the module's docstring)."""

    def __init__(self, tokens: list[int], parents: torch.Tensor) -> None:
        self.tokens, self.kids, self.members, self.path = tokens, children(parents), [-1], []

    @property
    def row(self) -> int:
        """The class's row in the verified sequence (its first member's)."""
        return self.members[0] + 1

    def candidates(self) -> list[int]:
        """The class's candidates, every member's children, in node order: the order they were drawn in, a node added
        after the draws (a retrieved one, ``families/rasd``) after all of them (see the module's docstring)."""
        return sorted(c for m in self.members for c in self.kids.get(m, []))

    def accept(self, token: int, below: list[int]) -> None:
        self.members = [c for c in below if self.tokens[c] == token]
        self.path.append(self.members[0])


def verify_tree_greedy(argmax: list[int], tokens: list[int], parents: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree.

    Args:
        argmax: (1+N) the target's greedy token after each sequence entry.
        tokens: (N) node tokens.

    Returns:
        (accepted path as node indices, the target's token after it).
    """
    walk = Walk(tokens, parents)
    while True:
        choice, below = argmax[walk.row], walk.candidates()
        if not any(tokens[c] == choice for c in below):
            return walk.path, choice
        walk.accept(choice, below)


def verify_tree_sampling(
    p: torch.Tensor, q: torch.Tensor | None, tokens: list[int], parents: torch.Tensor, generator
) -> tuple[list[int], int]:
    """Lossless multi-candidate speculative sampling down a tree (SpecInfer's multi-step rule).

    At a node, its children are tried in order; child c, drawn from q[c], is accepted with
    probability min(1, r(x_c) / q[c](x_c)) where r starts as the target's p at that node
    and becomes norm(max(0, r - q[c])) after each rejection. If every child is rejected the
    token is drawn from the final r. Each child must be drawn from its q row independently of
    its siblings' draws given the context (i.i.d. siblings share a row; deterministic distinct
    siblings are point masses, ``q=None``).

    Args:
        p: (1+N, V) target distributions after each sequence entry.
        q: (N, V) each node's proposal distribution, or None for point masses.
        tokens: (N) node tokens.

    Returns:
        (accepted path as node indices, the token drawn after it).
    """
    walk, vocab = Walk(tokens, parents), p.shape[-1]
    while True:
        r, below = p[walk.row], walk.candidates()
        for c in below:
            qc = one_hot(tokens[c], vocab) if q is None else q[c]
            x = tokens[c]
            if torch.rand((), generator=generator) * qc[x] < r[x]:
                walk.accept(x, below)
                break
            r = residual(r, qc)
        else:
            return walk.path, sample(r, generator)


def verify_tree_spectr(
    p: torch.Tensor, q: torch.Tensor | None, tokens: list[int], parents: torch.Tensor, generator
) -> tuple[list[int], int]:
    """SpecTr down a tree: at each node, K-SEQ (``sampling.verify_kseq``) over its children, which must be i.i.d.
    draws from one distribution given the node's path (a sampled tree drawn with replacement); a chain is the
    m = 1 case, ordinary speculative sampling. Lossless for the same reason as each node's K-SEQ: the accepted
    child's subtree was drawn given its path alone.

    Args and returns as ``verify_tree_sampling``; ``q`` None (point masses) only for chains.
    """
    walk, vocab = Walk(tokens, parents), p.shape[-1]
    while True:
        below = walk.candidates()
        if not below:
            return walk.path, sample(p[walk.row], generator)
        row = one_hot(tokens[below[0]], vocab) if q is None else q[below[0]]
        if len(below) > 1 and (q is None or any(not torch.equal(q[c], row) for c in below[1:])):
            raise DraftsmithError(
                "--verify spectr needs each node's candidates drawn i.i.d. from one distribution (--tree sampled); "
                "this draft's siblings come from different ones"
            )
        chosen, token = verify_kseq(p[walk.row], row, [tokens[c] for c in below], generator)
        if chosen is None:
            return walk.path, token
        walk.accept(token, below)


class VerifyRule(StrEnum):
    """A multi-candidate rule for sampling (greedy verification follows the argmax whatever the rule), read from
    ``--verify`` once (``parse``). RSD (Jeon et al. 2024) verifies with the same recursive rejection as SpecInfer:
    what makes it RSD is its candidates, drawn without replacement with each sibling's row the renormalised remainder
    (``sampling.draw_candidates``; RSD-C), or as the first draws of such a sampling that won a place in a stochastic
    beam search (``tree_draft``'s beam trees; RSD-S), which that rule needs to stay lossless; SpecInfer and SpecTr
    draw siblings i.i.d."""

    SPECINFER = "specinfer"
    SPECTR = "spectr"
    RSD = "rsd"

    @classmethod
    def parse(cls, value: str) -> VerifyRule:
        """``--verify``'s value as a rule, or one line naming the flag and the rules."""
        try:
            return cls(value)
        except ValueError:
            raise DraftsmithError(f"--verify must be one of {', '.join(cls)}, got {value!r}") from None

    @property
    def replacement(self) -> bool:
        """Whether the rule's sampled trees draw siblings with replacement (i.i.d.)."""
        return self is not VerifyRule.RSD

    @property
    def verify_tree(self) -> Callable[..., tuple[list[int], int]]:
        """The rule down a tree: ``verify_tree_spectr`` or ``verify_tree_sampling`` (SpecInfer's and RSD's)."""
        return verify_tree_spectr if self is VerifyRule.SPECTR else verify_tree_sampling


class TreeKind(StrEnum):
    """The shape a tree drafter drafts (``layers.tree_draft``), read from ``--tree`` once (``parse``)."""

    CHAIN = "chain"
    STATIC = "static"
    DYNAMIC = "dynamic"
    SAMPLED = "sampled"
    BEAM = "beam"

    @classmethod
    def parse(cls, value: str) -> TreeKind:
        """``--tree``'s value as a kind, or one line naming the flag and the kinds."""
        try:
            return cls(value)
        except ValueError:
            raise DraftsmithError(f"--tree must be one of {', '.join(cls)}, got {value!r}") from None

    @property
    def draws(self) -> bool:
        """Whether each node's several candidates are drawn from the drafter's distribution (sampled and beam
        trees, which need sampling); a chain has one per node, static and dynamic trees take the top ranks."""
        return self in (TreeKind.SAMPLED, TreeKind.BEAM)

    @property
    def sized(self) -> bool:
        """Whether ``--tree_size`` shapes it (static and dynamic trees)."""
        return self in (TreeKind.STATIC, TreeKind.DYNAMIC)
