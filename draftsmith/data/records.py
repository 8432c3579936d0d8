"""One prompt record (plain text or chat messages) and reading them from JSONL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain text, or chat messages ([{"role": ..., "content": ...}])."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None
    source: str | None = None
    """Where the prompt comes from (the record's ``source`` field), when known."""
    category: str | None = None
    """The prompt's category (the record's ``category`` field, e.g. MT-bench's "writing", "math"), when known."""
    check: dict | None = None
    """How an answer to it is checked (the record's ``check`` field, ``data/checks.py``), when it has one."""


def parse_record(record, where: str, field: str) -> Prompt:
    if not isinstance(record, dict):
        raise DraftsmithError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if field in record:
        text = record[field]
        if not isinstance(text, str):
            raise DraftsmithError(f"{where}: field {field!r} must be a string")
        return Prompt(
            text=text, source=record.get("source"), category=record.get("category"), check=_check(record, where)
        )
    if "messages" in record:
        msgs = record["messages"]
        if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "content" in m for m in msgs)):
            raise DraftsmithError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        return Prompt(
            messages=tuple(msgs),
            source=record.get("source"),
            category=record.get("category"),
            check=_check(record, where),
        )
    raise DraftsmithError(f"{where}: no {field!r} or 'messages' field (keys: {sorted(record)})")


def _check(record: dict, where: str) -> dict | None:
    check = record.get("check")
    if check is None:
        return None
    from draftsmith.data.checks import validate

    return validate(check, where)


def read_jsonl(path: Path, field: str = "prompt") -> list[Prompt]:
    """Read a JSONL prompt file; a bad line is an error naming file and line number."""
    if not path.is_file():
        raise DraftsmithError(f"prompts: file not found: {path}")
    prompts = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DraftsmithError(
                    f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DraftsmithError(f"{where}: malformed JSON ({e.msg})") from None
            prompts.append(parse_record(record, where, field))
    return prompts
