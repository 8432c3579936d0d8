"""Prompt-lookup / n-gram drafter: copy what followed the last occurrence of the current suffix."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput


@dataclass
class NGramState:
    ids: list[int]
    index: dict[int, dict[tuple[int, ...], list[int]]] = field(default_factory=dict)
    """index[n][gram] = positions right after the latest earlier occurrences of ``gram`` (oldest first)."""


def continuation(ids: list[int], start: int, k: int) -> list[int]:
    """The ``k`` tokens after the match that ends at ``start``, copied as LZ77 copies: a match close to the end of
    ``ids`` runs on into the tokens it is drafting (a repeat of period ``len(ids) - start``), so it still drafts
    ``k`` tokens where a plain slice would stop at the end of ``ids``.
    """
    period = len(ids) - start
    return [ids[start + i % period] for i in range(k)]


class NGramDrafter(Drafter):
    """The baseline drafter of prompt-lookup decoding; deterministic, needs no training.

    Args:
        max_ngram: longest suffix to look up (tried first).
        min_ngram: shortest suffix to look up.
        width: how many distinct continuations of the suffix to propose, merged into a token
            tree (1: a chain, the latest one).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, width: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.max_ngram, self.min_ngram, self.width = max_ngram, min_ngram, width

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> NGramState:
        state = NGramState(ids=[], index={n: {} for n in range(self.min_ngram, self.max_ngram + 1)})
        self._extend(state, tokens.tolist())
        return state

    def _extend(self, state: NGramState, new: list[int]) -> None:
        for token in new:
            t = len(state.ids)  # the n-grams ending just before t get continuation position t
            for n, table in state.index.items():
                if t >= n:
                    seen = table.setdefault(tuple(state.ids[t - n : t]), [])
                    seen.append(t)
                    del seen[: -4 * self.width]
            state.ids.append(token)

    def propose(self, state: NGramState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        ids = state.ids
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ids) < n:
                continue
            starts = state.index[n].get(tuple(ids[-n:]))
            if starts:
                return self._trie([continuation(ids, s, k) for s in reversed(starts)])
        return Draft.empty()

    def _trie(self, continuations: list[list[int]]) -> Draft:
        """The first ``width`` distinct continuations (latest first) as a tree with distinct siblings."""
        kept: list[list[int]] = []
        for c in continuations:
            if c and c not in kept:
                kept.append(c)
            if len(kept) == self.width:
                break
        if len(kept) <= 1:
            return Draft.chain(kept[0] if kept else [])
        nodes: dict[tuple[int, int], int] = {}
        tokens, parents = [], []
        for c in kept:
            parent = -1
            for t in c:
                if (parent, t) not in nodes:
                    nodes[parent, t] = len(tokens)
                    tokens.append(t)
                    parents.append(parent)
                parent = nodes[parent, t]
        return Draft(torch.tensor(tokens), torch.tensor(parents))

    def advance(self, state: NGramState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        self._extend(state, tokens.tolist())
