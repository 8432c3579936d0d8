"""A retrieval datastore from an on-policy corpus: a suffix array over its rows' token ids (RASD's and REST's
datastore), saved beside the corpus with its target's fingerprint.

``draftsmith datastore DATA`` indexes every row of a ``draftsmith generate`` dir (or a packed ``.tar.xz`` corpus)
as one document (its prompt and the target's answer) and writes ``DATA.datastore/`` (``tokens.npy``,
``suffixes.npy``, ``datastore.json``: the corpus's target fingerprint, rows, tokens, bytes and build seconds). The
drafter spec ``rasd:datastore=DIR:DRAFTER`` reads it (``families.rasd.retrieval.SuffixIndex.load``), refusing in one line
a datastore made for another target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.files import made_whole
from draftsmith.data.shards import load_generated
from draftsmith.errors import DraftsmithError
from draftsmith.families.rasd.retrieval import SuffixIndex

FORMAT = 1
"""The datastore dir's format version (``datastore.json``)."""


@dataclass(frozen=True)
class Datastore:
    """What ``build_datastore`` wrote."""

    path: Path
    rows: int
    tokens: int
    bytes: int
    build_seconds: float


def default_out(data: str | Path) -> Path:
    """Beside the corpus: ``DATA.datastore`` (for a packed file, ``FILE.tar.xz.datastore``)."""
    data = Path(data)
    return data.with_name(data.name + ".datastore")


def build_datastore(data: Path, out: Path | None = None, order: int = 16) -> Path:
    """Index a generated corpus for retrieval drafting (``draftsmith datastore DATA [--out DIR]``).

    Args:
        data: a complete ``draftsmith generate`` dir or a packed corpus file.
        out: the datastore dir to write (default: beside the corpus, ``DATA.datastore``).
        order: longest suffix a lookup may match (the suffix array is sorted on this many leading tokens).
    """
    store = build(data, out, order)
    print(
        f"{store.path}: {store.rows:,} rows, {store.tokens:,} tokens, {store.bytes / 1e6:.1f} MB, built in "
        f"{store.build_seconds:.2f} s; draft with --drafter rasd:datastore={store.path}:DRAFTER"
    )
    return store.path


def build(data: str | Path, out: str | Path | None = None, order: int = 16) -> Datastore:
    """``build_datastore`` without the printout."""
    if order < 1:
        raise DraftsmithError(f"datastore: --order must be positive, got {order}")
    out = Path(out) if out is not None else default_out(data)
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"datastore: --out {out} is a file; name the directory to write the datastore in")
    if out.is_dir() and any(out.iterdir()) and not (out / "datastore.json").is_file():
        raise DraftsmithError(f"datastore: --out {out} holds other files than a datastore; name another directory")
    dataset, metadata = load_generated(data)
    start = time.perf_counter()
    index = SuffixIndex.build(dataset["input_ids"], order)
    seconds = time.perf_counter() - start
    record = {
        "format": FORMAT,
        "fingerprint": metadata["target"],
        "source": str(data),
        "rows": len(dataset),
        "build_seconds": round(seconds, 4),
    }
    made_whole(out, lambda tmp: index.save(tmp, record))  # an earlier datastore stays until this one is whole
    size = sum(f.stat().st_size for f in out.iterdir())
    return Datastore(out, len(dataset), len(index), size, seconds)
