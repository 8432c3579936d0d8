"""RASD in the pipeline: the fused drafter scored beside the others.

Retrieval from the prompt, the text generated so far and a datastore of the pipeline's generated training corpus
(``data/train.datastore``; never the held-out data the verifier scores on), fused into the tree of the trained tree
drafter that was fastest at the main K (``families/rasd``). It is scored in the ``--k auto`` block, which chooses
its depth and retrieval budget for this machine as it chooses every drafter's K.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_type_hints

from draftsmith.data.datastore import build, default_out
from draftsmith.errors import DraftsmithError
from draftsmith.eval.rows import ScoreRow
from draftsmith.families.specs import Named, Rasd, Trained


def datastore(train: Path) -> Path:
    """The training corpus's datastore, ``DATA.datastore`` beside it: reused when it was built after the corpus was
    written (by ``generate --datastore`` or an earlier run), else built (seconds) and its size printed."""
    path = default_out(train)
    record, corpus = path / "datastore.json", train / "draftsmith.json"
    if record.is_file() and record.stat().st_mtime >= corpus.stat().st_mtime:
        return path
    store = build(train, path)
    print(
        f"  datastore {path}: {store.rows:,} rows, {store.tokens:,} tokens, {store.bytes / 1e6:.1f} MB, built in "
        f"{store.build_seconds:.2f} s (retrieval for the fused drafter)"
    )
    return path


def is_tree_drafter(path: Path) -> bool:
    """Whether the trained drafter in ``path`` drafts trees RASD can fuse retrieval into (a ``TreeDrafter``: EAGLE,
    Medusa/Hydra, the parallel drafters, draft LMs; not Kangaroo's self-drafting nor an acceptance head), read from
    its family's ``as_drafter`` without loading its weights."""
    from draftsmith.families.registry import family
    from draftsmith.layers.tree_draft import TreeDrafter

    try:
        method = json.loads((path / "config.json").read_text())["method"]
        drafter = get_type_hints(family(method).network.as_drafter).get("return")
    except (OSError, KeyError, ValueError, DraftsmithError):
        return False
    return isinstance(drafter, type) and issubclass(drafter, TreeDrafter)


def fused_spec(rows: list[ScoreRow], specs: list[Named], store: Path | None) -> Named | None:
    """RASD over the trained tree drafter of highest measured speedup in ``rows`` (ties: τ), retrieving from the
    context and ``store``; None when no trained drafter drafts trees."""
    trained = {s.name: s.spec.path for s in specs if isinstance(s.spec, Trained)}
    candidates = [r for r in rows if r.name in trained and is_tree_drafter(Path(trained[r.name]))]
    if not candidates:
        return None
    best = max(candidates, key=lambda r: (r.speedup, r.tau))
    return Named(f"{best.name}+rasd", Rasd(trained[best.name], datastore=str(store) if store else None))
