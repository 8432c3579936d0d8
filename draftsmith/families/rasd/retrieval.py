"""Retrieval over token ids: every continuation of the longest matching suffix, most frequent first.

Two indexes answer the same question ("what followed the context's last n tokens?") for retrieval drafting (REST,
He et al. 2024; RASD, Quan et al. 2025):

- ``ContextIndex``: the prompt and the text generated so far, grown token by token (every earlier occurrence of
  each n-gram, not only the latest);
- ``SuffixIndex``: a static corpus (a datastore), a suffix array over its documents' token ids, looked up by binary
  search; saved as two ``.npy`` arrays beside a JSON record with the target's fingerprint (``save`` / ``load``).

Both turn the continuations of their matches into a weighted trie (``select``): a node's count is how many matches
continue through it, and the ``budget`` nodes of highest count (ties: the earlier-listed match) are kept, which is
prefix-closed because a child never counts more than its parent. A lookup returns the kept trie as root-to-leaf paths.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.errors import DraftsmithError

SEPARATOR = -1
"""Between documents in a ``SuffixIndex`` (never a token, so no match runs across documents)."""


def select(continuations: Iterable[list[int]], budget: int) -> list[list[int]]:
    """The ``budget`` most frequent trie nodes of ``continuations`` (listed by priority), as root-to-leaf paths.

    Args:
        continuations: what followed each match, best-first on ties (e.g. latest first).
        budget: trie nodes to keep.

    Returns:
        the kept trie's leaf paths, most frequent leaf first (ties: the earlier-listed match).
    """
    count: dict[tuple[int, ...], int] = {}
    first: dict[tuple[int, ...], int] = {}
    kids: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for order, cont in enumerate(continuations):
        for d in range(1, len(cont) + 1):
            node = tuple(cont[:d])
            if node not in count:
                count[node], first[node] = 0, order
                kids.setdefault(node[:-1], []).append(node)
            count[node] += 1
    heap = [(-count[c], first[c], c) for c in kids.get((), [])]
    heapq.heapify(heap)
    kept: list[tuple[int, ...]] = []
    while heap and len(kept) < budget:
        _, _, node = heapq.heappop(heap)
        kept.append(node)
        for c in kids.get(node, []):
            heapq.heappush(heap, (-count[c], first[c], c))
    chosen = set(kept)
    leaves = [n for n in kept if not any(c in chosen for c in kids.get(n, []))]
    return [list(n) for n in sorted(leaves, key=lambda n: (-count[n], first[n]))]


class ContextIndex:
    """The n-grams of a growing token sequence (prompt + generated text) and where each occurrence continues.

    Args:
        max_ngram: longest suffix looked up (tried first).
        min_ngram: shortest suffix looked up.
        max_matches: occurrences remembered per n-gram (the latest).
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_matches: int = 64) -> None:
        if not 1 <= min_ngram <= max_ngram or max_matches < 1:
            raise DraftsmithError(
                f"retrieval: need 1 <= min_ngram <= max_ngram and max_matches >= 1, got {min_ngram}, {max_ngram}, "
                f"{max_matches}"
            )
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches
        self.ids: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}
        """n-gram -> the positions right after its earlier occurrences, oldest first."""

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            t = len(self.ids)  # the n-grams ending just before t continue at t
            for n in range(self.min_ngram, min(self.max_ngram, t) + 1):
                seen = self.starts.setdefault(tuple(self.ids[t - n : t]), [])
                seen.append(t)
                del seen[: -self.max_matches]
            self.ids.append(int(token))

    def lookup(self, length: int, budget: int) -> list[list[int]]:
        """Trie paths (``select``) of what followed the longest earlier occurrence of the sequence's suffix, up to
        ``length`` tokens each, latest occurrence first on ties; [] when no suffix occurred before."""
        ids = self.ids
        for n in range(min(self.max_ngram, len(ids)), self.min_ngram - 1, -1):
            starts = self.starts.get(tuple(ids[-n:]))
            if starts:
                return select((_copy(ids, s, length) for s in reversed(starts)), budget)
        return []


def _copy(ids: list[int], start: int, length: int) -> list[int]:
    """``length`` tokens from ``start``, copied as LZ77 copies: a match close to the end runs on into the tokens it
    drafts (a repeat of period ``len(ids) - start``)."""
    period = len(ids) - start
    return [ids[start + i % period] for i in range(length)]


class SuffixIndex:
    """A suffix array over documents of token ids, joined by ``SEPARATOR``.

    Args:
        tokens: (N,) int32 token ids, documents joined by ``SEPARATOR``.
        suffixes: (N,) int64 start positions, ordered by the suffixes' first ``order`` tokens (ties by position).
        order: how many leading tokens the ordering is exact for: the longest suffix a lookup may match.
        max_matches: occurrences read per lookup (evenly spaced over the matching rows), bounding its latency.
    """

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, order: int, max_matches: int = 256) -> None:
        if tokens.shape != suffixes.shape:
            raise DraftsmithError(f"retrieval: {len(tokens)} tokens but {len(suffixes)} suffixes")
        self.tokens, self.suffixes, self.order, self.max_matches = tokens, suffixes, order, max_matches

    @classmethod
    def build(cls, documents: Iterable[list[int]], order: int = 16) -> SuffixIndex:
        """Index ``documents``: prefix doubling (sort by the first 1, 2, 4, ... tokens) until every suffix's rank
        is unique or ``order`` tokens are sorted."""
        parts = []
        for doc in documents:
            parts += [np.asarray(doc, dtype=np.int32), np.array([SEPARATOR], dtype=np.int32)]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        n = len(tokens)
        rank = tokens.astype(np.int64)  # the separator (-1) sorts first
        suffixes, width = np.argsort(rank, kind="stable"), 1
        while width < order and n:
            nxt = np.full(n, -2, dtype=np.int64)  # past the end: before everything
            nxt[: n - width] = rank[width:]
            suffixes = np.lexsort((nxt, rank))  # stable: ties keep position order
            key_r, key_n = rank[suffixes], nxt[suffixes]
            new = np.empty(n, dtype=np.int64)
            new[suffixes] = np.cumsum(np.r_[0, (key_r[1:] != key_r[:-1]) | (key_n[1:] != key_n[:-1])])
            rank, width = new, 2 * width
            if rank.max() == n - 1:
                break
        return cls(tokens, suffixes.astype(np.int64), order)

    def __len__(self) -> int:
        return len(self.tokens)

    def _prefix(self, i: int, n: int) -> tuple[int, ...]:
        s = int(self.suffixes[i])
        return tuple(self.tokens[s : s + n].tolist())

    def _range(self, pattern: tuple[int, ...]) -> tuple[int, int]:
        """Suffix-array rows whose suffix starts with ``pattern`` (binary search on both ends)."""
        n, lo, hi = len(pattern), 0, len(self.suffixes)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._prefix(mid, n) < pattern:
                lo = mid + 1
            else:
                hi = mid
        start, hi = lo, len(self.suffixes)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._prefix(mid, n) <= pattern:
                lo = mid + 1
            else:
                hi = mid
        return start, lo

    def lookup(self, context: list[int], length: int, budget: int, max_ngram: int, min_ngram: int = 1):
        """Trie paths (``select``) of what followed the corpus's occurrences of the context's longest suffix of
        ``min_ngram``..``max_ngram`` tokens (at most ``order``), up to ``length`` tokens each, never across a
        document's end; [] when none occurs."""
        for n in range(min(max_ngram, self.order, len(context)), min_ngram - 1, -1):
            start, end = self._range(tuple(context[-n:]))
            if start == end:
                continue
            rows = np.unique(np.linspace(start, end - 1, min(end - start, self.max_matches)).astype(np.int64))
            conts = []
            for s in self.suffixes[rows].tolist():
                cont = self.tokens[s + n : s + n + length].tolist()
                cut = cont.index(SEPARATOR) if SEPARATOR in cont else len(cont)
                conts.append(cont[:cut])
            paths = select(conts, budget)
            if paths:
                return paths
        return []

    def save(self, out: Path, record: dict) -> None:
        """Write ``tokens.npy``, ``suffixes.npy`` and ``datastore.json`` (``record`` + the index's sizes) to
        ``out``; ``record`` must hold the target's ``fingerprint``."""
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "tokens.npy", self.tokens)
        np.save(out / "suffixes.npy", self.suffixes)
        info = {**record, "order": self.order, "tokens": len(self.tokens)}
        (out / "datastore.json").write_text(json.dumps(info, indent=2) + "\n")

    @staticmethod
    def read_record(path: str | Path) -> dict:
        """The record of the datastore dir ``path``, refused in one line unless it is whole (a readable
        ``datastore.json``, ``tokens.npy`` and ``suffixes.npy``): cheap, so checked before a target is loaded."""
        path = Path(path)
        meta = path / "datastore.json"
        if not meta.is_file():
            raise DraftsmithError(f"datastore {path}: no datastore.json here; build one with draftsmith datastore")
        try:
            info = json.loads(meta.read_text())
        except json.JSONDecodeError as e:
            raise DraftsmithError(f"datastore {path}: {meta} is not valid JSON ({e.msg}); rebuild it") from None
        missing = [name for name in ("tokens.npy", "suffixes.npy") if not (path / name).is_file()]
        if missing or not isinstance(info, dict) or "fingerprint" not in info or "order" not in info:
            what = path / missing[0] if missing else f"{meta} (no fingerprint or order)"
            raise DraftsmithError(f"datastore {path}: {what} is missing; rebuild it with draftsmith datastore")
        return info

    @classmethod
    def load(cls, path: str | Path, fingerprint: dict | None = None) -> tuple[SuffixIndex, dict]:
        """A saved index (memory-mapped) and its record; refused in one line when ``fingerprint`` is not the one it
        was made for."""
        path = Path(path)
        info = cls.read_record(path)
        if fingerprint is not None:
            check_fingerprint(info["fingerprint"], fingerprint, f"datastore {path}")
        start = time.perf_counter()
        tokens = np.load(path / "tokens.npy", mmap_mode="r")
        suffixes = np.load(path / "suffixes.npy", mmap_mode="r")
        index = cls(tokens, suffixes, info["order"])
        info["load_seconds"] = time.perf_counter() - start
        return index, info
