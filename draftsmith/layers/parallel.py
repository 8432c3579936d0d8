"""Parallel drafting: a whole draft from one forward (PARD, P-EAGLE, DFlash).

A parallel drafter appends placeholders ("mask" inputs) after the last committed token and reads the
distribution of draft position d+1 off placeholder d, all in one call. Its q at depth d does not depend on the
tokens drafted before it, so a draft is a Medusa-like tree: ``ParallelDrafter.root`` runs the one forward and
``grow`` hands out its rows, which gives chains, static trees (from per-depth top-k accuracies) and dynamic trees
for the price of one forward per round.

Training predicts every depth from every anchor in one forward too. Anchor ``a`` (the layout of
``layers/estimate.py``: it has committed x_0..x_{a+1} and predicts x_{a+2}) gets a chain of placeholders
``(d, a)`` for d = 1..D-1, which see the real sequence up to the anchor and their own chain only (PARD's and
P-EAGLE's parallel training masks). PARD's *conditional token dropping* keeps a shrinking, nested random subset of
anchors at deeper depths, which is most of the saving: a chain missing depth d can have no depth d+1.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from draftsmith.layers.tree_draft import TreeDrafter


@dataclass
class ParallelLayout:
    """The input of one parallel training forward: the real sequence, then one segment of placeholders per depth.

    Attributes:
        anchors: per depth d = 1..D-1, the (n_d,) anchors whose chain reaches depth d (nested: each a subset of
            the one before).
        mask: (B, 1, Q, Q) bool attention mask over the T real positions followed by the placeholder segments.
        positions: (B, Q) position ids (real position t: t; placeholder (d, a): the anchor's position + d).
    """

    anchors: list[torch.Tensor]
    mask: torch.Tensor
    positions: torch.Tensor


def keep_anchors(t: int, depth: int, keep_ratio: float, generator: torch.Generator | None) -> list[torch.Tensor]:
    """Conditional token dropping: per depth d = 1..depth-1, ceil(t * keep_ratio**d) anchors, each depth a random
    subset of the one before (ascending). ``keep_ratio`` 1 keeps every anchor at every depth."""
    kept, current = [], torch.arange(t)
    for d in range(1, depth):
        n = min(len(current), math.ceil(t * keep_ratio**d))
        if n < len(current):
            current = current[torch.randperm(len(current), generator=generator)[:n]].sort().values
        kept.append(current)
    return kept


def rarest_token(counts: torch.Tensor) -> int:
    """The placeholder token of a parallel drafter: the least frequent id of (V,) training-data counts (the
    highest among ties: reserved ids sit at the end). Engines read placeholders as ordinary token ids."""
    return int((counts == counts.min()).nonzero()[-1])


def parallel_layout(valid: torch.Tensor, anchors: list[torch.Tensor], last_real: int) -> ParallelLayout:
    """Mask and positions of the real sequence plus placeholder chains.

    Args:
        valid: (B, T) 1 on real (non-pad) tokens.
        anchors: per depth d = 1..D-1, the anchors with a placeholder at that depth (see ``keep_anchors``).
        last_real: anchor a's last real input is position a + last_real (a draft LM reads x_{a+1}: 1; an EAGLE
            layer pairs x_{a+1} with the feature of position a at row a: 0). Placeholder (d, a) sits at position
            a + last_real + d.

    Returns:
        the ``ParallelLayout``: real rows attend causally; placeholder (d, a) attends to real rows
        <= a + last_real and to placeholders (d', a) with d' <= d.
    """
    b, t = valid.shape
    device = valid.device
    segment_anchor = torch.cat([torch.arange(t, device=device) - last_real, *[a.to(device) for a in anchors]])
    segment_depth = torch.cat(
        [torch.zeros(t, dtype=torch.long, device=device)]
        + [torch.full((len(a),), d + 1, dtype=torch.long, device=device) for d, a in enumerate(anchors)]
    )
    real = segment_depth == 0
    qa, qd = segment_anchor[:, None], segment_depth[:, None]  # queries
    ka, kd = segment_anchor[None, :], segment_depth[None, :]  # keys
    sees_real = real[None, :] & (ka <= qa)  # real keys up to the query's anchor (causal for real queries)
    sees_chain = ~real[None, :] & ~real[:, None] & (ka == qa) & (kd <= qd)
    mask = sees_real | sees_chain  # (Q, Q)
    chains = torch.cat(anchors).to(device) if anchors else torch.zeros(0, dtype=torch.long, device=device)
    keys_valid = torch.cat([valid.bool(), valid.bool()[:, (chains + last_real).clamp(0, t - 1)]], dim=1)
    mask = mask[None, None] & keys_valid[:, None, None, :]
    mask = mask | torch.eye(len(segment_anchor), dtype=torch.bool, device=device)[None, None]  # no empty rows
    positions = (segment_anchor + last_real + segment_depth)[None].expand(b, -1)
    return ParallelLayout(anchors, mask, positions)


def split_depths(out: torch.Tensor, layout: ParallelLayout) -> list[torch.Tensor]:
    """(B, Q, ...) outputs of a parallel forward -> per depth d = 1..D-1, the (B, n_d, ...) placeholder rows."""
    t = out.shape[1] - sum(len(a) for a in layout.anchors)
    pieces, start = [], t
    for a in layout.anchors:
        pieces.append(out[:, start : start + len(a)])
        start += len(a)
    return pieces


class ParallelDrafter(TreeDrafter):
    """A drafter whose one forward gives every depth's logits (``block_logits``); trees come for free (Medusa's
    heads are one too).

    Attributes:
        max_depth: the most positions one forward drafts (what it was trained for).
    """

    @abstractmethod
    def block_logits(self, state: Any, k: int) -> torch.Tensor:
        """(k, V) logits of draft positions 1..k after the committed tokens, from one forward."""

    def propose(self, state, k, sampling, generator):
        self._round_depth = self._depth(k)
        return super().propose(state, k, sampling, generator)

    @torch.no_grad()
    def root(self, state: Any) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.block_logits(state, self._round_depth).float()
        return logits, logits[0]

    def grow(self, state, scratch: torch.Tensor, tokens, parents, new) -> torch.Tensor:
        depth, p = 1, parents[new[0]]
        while p >= 0:
            depth, p = depth + 1, parents[p]
        return scratch[depth].expand(len(new), -1)


@dataclass
class DepthLogits:
    """A parallel training forward's predictions at one depth d (0-based: depth 0 predicts x_{a+2}).

    Attributes:
        anchors: (n,) the anchors predicted at this depth.
        logits: (B, n, Vd) the drafter's logits there (over its draft vocabulary).
    """

    anchors: torch.Tensor
    logits: torch.Tensor
