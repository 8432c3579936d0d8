"""Prompt-lookup / n-gram drafter: copy what followed the last occurrence of the current suffix."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.eval.sampling import Sampling
from draftsmith.models.base import Draft, Drafter
from draftsmith.target import TargetOutput


@dataclass
class NGramState:
    ids: list[int]
    index: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    """index[n][gram] = position right after the latest earlier occurrence of ``gram``."""


class NGramDrafter(Drafter):
    """The baseline drafter of prompt-lookup decoding; deterministic, needs no training.

    Args:
        max_ngram: longest suffix to look up (tried first).
        min_ngram: shortest suffix to look up.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> NGramState:
        state = NGramState(ids=[], index={n: {} for n in range(self.min_ngram, self.max_ngram + 1)})
        self._extend(state, tokens.tolist())
        return state

    def _extend(self, state: NGramState, new: list[int]) -> None:
        for token in new:
            t = len(state.ids)  # the n-grams ending just before t get continuation position t
            for n, table in state.index.items():
                if t >= n:
                    table[tuple(state.ids[t - n : t])] = t
            state.ids.append(token)

    def propose(self, state: NGramState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        ids = state.ids
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ids) < n:
                continue
            start = state.index[n].get(tuple(ids[-n:]))
            if start is not None:
                return Draft.chain(ids[start : start + k])
        return Draft.empty()

    def advance(self, state: NGramState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        self._extend(state, tokens.tolist())
