"""Checking an answer: what a lossy rule's quality is measured by (``data/checkable.py``'s prompts carry checks).

A check is a small dict stored with its prompt:

- ``{"kind": "contains", "answer": TEXT}``: the answer holds TEXT (case-insensitive);
- ``{"kind": "python", "test": CODE}``: the answer's first Python code block (the whole answer when it has none),
  run with CODE after it in a fresh, isolated interpreter, exits cleanly within ``TIMEOUT_S``.
"""

from __future__ import annotations

import re
import subprocess
import sys

from draftsmith.errors import DraftsmithError

KINDS = {"contains": "answer", "python": "test"}
TIMEOUT_S = 10.0
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.S)


def validate(check, where: str) -> dict:
    """``check`` as given when it is one of ``KINDS`` with its string field, else one line naming ``where``."""
    kind = check.get("kind") if isinstance(check, dict) else None
    field = KINDS.get(kind)
    if field is None or not isinstance(check.get(field), str):
        forms = " or ".join(f'{{"kind": "{k}", "{f}": ...}}' for k, f in KINDS.items())
        raise DraftsmithError(f"{where}: 'check' must be {forms}, got {check!r}")
    return check


def code_of(answer: str) -> str:
    """The first fenced code block of ``answer``, or all of it when it has none."""
    match = _FENCE.search(answer)
    return match.group(1) if match else answer


def passes(check: dict, answer: str) -> bool:
    """Whether ``answer`` passes ``check``."""
    if check["kind"] == "contains":
        return check["answer"].lower() in answer.lower()
    program = code_of(answer) + "\n\n" + check["test"] + "\n"
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-c", program], capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return False
    return run.returncode == 0
