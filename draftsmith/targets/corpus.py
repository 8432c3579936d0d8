"""The default target's corpus: the Python standard library's own source, present on every machine.

Files are split into train / held-out by a hash of their path relative to the
stdlib root, so the split is the same on every machine that has the file. The
held-out files also give the default prompt set: function signatures with
their docstrings, whose bodies the target has never seen.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, heldout_percent: int) -> bool:
    digest = hashlib.sha256(relpath.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < heldout_percent


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    text: str


def iter_sources(root: Path | None = None) -> Iterator[SourceFile]:
    """Every readable ``.py`` file under the stdlib root, sorted, minus ``site-packages``."""
    root = root or stdlib_root()
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts)
    if not paths:
        raise DraftsmithError(f"corpus: no Python files under {root}")
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield SourceFile(str(path.relative_to(root)), text)


def split(heldout_percent: int = 5, root: Path | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, held-out) source files."""
    train, heldout = [], []
    for src in iter_sources(root):
        (heldout if is_heldout(src.relpath, heldout_percent) else train).append(src)
    return train, heldout


def signature_prompts(files: list[SourceFile], max_prompts: int = 200, max_chars: int = 600) -> list[dict]:
    """Prompts made of a function's ``def`` line(s) and docstring, from the given files.

    Each prompt ends right after the docstring (plus a newline and the body's
    indentation), so the natural continuation is the function body.
    """
    prompts = []
    for src in files:
        try:
            tree = ast.parse(src.text)
        except (SyntaxError, ValueError):
            continue
        lines = src.text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)) or len(node.body) < 2:
                continue
            if isinstance(doc.value.value, str) and doc.end_lineno is not None:
                head = "".join(lines[node.lineno - 1 : doc.end_lineno])
                indent = " " * node.body[1].col_offset
                text = head + indent
                if len(text) <= max_chars:
                    prompts.append({"prompt": text, "source": f"{src.relpath}:{node.lineno}"})
    prompts.sort(key=lambda p: hashlib.sha256(p["source"].encode()).hexdigest())
    return prompts[:max_prompts]


def write_builtin_prompts(out_dir: Path, heldout_percent: int = 5, train: int = 2000, heldout: int = 200) -> None:
    """Regenerate the shipped prompt sets (``python -m draftsmith.targets.corpus``)."""
    import json

    train_files, heldout_files = split(heldout_percent)
    for name, files, n in (("train", train_files, train), ("heldout", heldout_files, heldout)):
        with open(out_dir / f"stdlib_{name}.jsonl", "w") as f:
            for p in signature_prompts(files, n):
                f.write(json.dumps(p) + "\n")


if __name__ == "__main__":
    write_builtin_prompts(Path(__file__).parent / "prompts")
