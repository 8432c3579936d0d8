"""A generated dataset dir as ``draftsmith generate`` leaves it: the ``datasets`` columns, ``draftsmith.json`` beside
them, and reading a complete one back. ``data/shards.py`` writes it shard by shard; ``data/packed.py`` packs it into
one file and back."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from draftsmith.core.files import write_whole
from draftsmith.errors import DraftsmithError

META = "draftsmith.json"
"""Metadata file beside the dataset."""


def features(store_topk: int):
    """The dataset's column types (``topk_*`` only when ``store_topk > 0``)."""
    from datasets import Features, List, Value

    cols = {
        "input_ids": List(Value("int32")),
        "loss_mask": List(Value("int8")),
        "prompt_len": Value("int32"),
        "prompt_index": Value("int64"),
        "sample_index": Value("int32"),
    }
    if store_topk:
        cols["topk_ids"] = List(List(Value("int32")))
        cols["topk_logprobs"] = List(List(Value("float32")))
    return Features(cols)


def _write_json(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data, indent=2) + "\n")


def read_metadata(out: Path) -> dict | None:
    """``out/draftsmith.json``, or None when there is none."""
    path = Path(out) / META
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{path}: malformed JSON ({e.msg})") from None


def write_metadata(out: Path, metadata: dict) -> None:
    _write_json(Path(out) / META, metadata)


@contextmanager
def quiet_datasets():
    """No ``datasets`` progress bars while saving: ``generate`` has its own."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def load_dir(path: str | Path):
    """The complete generated dir ``path``: (its ``datasets.Dataset``, its ``draftsmith.json`` as a dict)."""
    from datasets import load_from_disk

    path = Path(path)
    metadata = read_metadata(path)
    if metadata is None:
        raise DraftsmithError(f"{path} is not a generated dataset (no {META}); make one with draftsmith generate")
    if metadata.get("status") != "complete":
        raise DraftsmithError(
            f"{path} is an unfinished generation run; finish it with draftsmith generate ... --out {path} --resume"
        )
    return load_from_disk(str(path)), metadata
