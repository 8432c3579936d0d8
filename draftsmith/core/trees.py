"""Token trees in the target's verification pass: attention mask, positions, and acceptance rules.

The verified sequence is [root, node_0 .. node_{N-1}]: the root is the last committed token
and node i's parent is ``parents[i]`` (-1 = root). Each node sits at position
``committed + depth`` and attends to the whole committed context, the root, its ancestors and
itself. Row r of the target's output predicts the child of sequence entry r.
"""

from __future__ import annotations

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


def verify_tree_greedy(argmax: list[int], tokens: list[int], parents: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree.

    Args:
        argmax: (1+N) the target's greedy token after each sequence entry.
        tokens: (N) node tokens.

    Returns:
        (accepted path as node indices, the target's token after it).
    """
    kids, node, path = children(parents), -1, []
    while True:
        choice = argmax[node + 1]
        match = next((c for c in kids.get(node, []) if tokens[c] == choice), None)
        if match is None:
            return path, choice
        path.append(match)
        node = match


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
    kids, node, path = children(parents), -1, []
    vocab = p.shape[-1]
    while True:
        r = p[node + 1]
        for c in kids.get(node, []):
            qc = one_hot(tokens[c], vocab) if q is None else q[c]
            x = tokens[c]
            if torch.rand((), generator=generator) * qc[x] < r[x]:
                path.append(c)
                node = c
                break
            r = residual(r, qc)
        else:
            return path, sample(r, generator)


def verify_tree_spectr(
    p: torch.Tensor, q: torch.Tensor | None, tokens: list[int], parents: torch.Tensor, generator
) -> tuple[list[int], int]:
    """SpecTr down a tree: at each node, K-SEQ (``sampling.verify_kseq``) over its children, which must be i.i.d.
    draws from one distribution given the node's path (a sampled tree drawn with replacement); a chain is the
    m = 1 case, ordinary speculative sampling. Lossless for the same reason as each node's K-SEQ: the accepted
    child's subtree was drawn given its path alone.

    Args and returns as ``verify_tree_sampling``; ``q`` None (point masses) only for chains.
    """
    kids, node, path = children(parents), -1, []
    vocab = p.shape[-1]
    while True:
        below = kids.get(node, [])
        if not below:
            return path, sample(p[node + 1], generator)
        row = one_hot(tokens[below[0]], vocab) if q is None else q[below[0]]
        if len(below) > 1 and (q is None or any(not torch.equal(q[c], row) for c in below[1:])):
            raise DraftsmithError(
                "--verify spectr needs each node's candidates drawn i.i.d. from one distribution (--tree sampled); "
                "this draft's siblings come from different ones"
            )
        chosen, token = verify_kseq(p[node + 1], row, [tokens[c] for c in below], generator)
        if chosen is None:
            return path, token
        node = below[chosen]
        path.append(node)


VERIFY_RULES = {"specinfer": verify_tree_sampling, "spectr": verify_tree_spectr, "rsd": verify_tree_sampling}
"""Multi-candidate rules for sampling (greedy verification follows the argmax whatever the rule). RSD (Jeon et al.
2024) verifies with the same recursive rejection as SpecInfer: what makes it RSD is its candidates, drawn without
replacement with each sibling's row the renormalised remainder (``sampling.draw_candidates``), which that rule
needs to stay lossless; SpecInfer and SpecTr draw siblings i.i.d."""

REPLACEMENT = {"specinfer": True, "spectr": True, "rsd": False}
"""Whether each rule's sampled trees draw siblings with replacement."""
