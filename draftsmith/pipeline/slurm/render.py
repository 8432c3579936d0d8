"""Render the ``pipeline/slurm/templates/*.sbatch`` templates: ``{{name}}`` placeholders, nothing else.

Bash's own ``$VAR`` / ``${VAR}`` pass through untouched, so a template reads as the script it becomes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from draftsmith.errors import DraftsmithError

TEMPLATES = Path(__file__).with_name("templates")
"""The repository's ``slurm/`` directory (templates are files a cluster admin may read and adapt)."""

PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def template_path(name: str) -> Path:
    """``slurm/<name>.sbatch``, or ``name`` itself when it is a path to a template file."""
    path = Path(name) if name.endswith(".sbatch") else TEMPLATES / f"{name}.sbatch"
    if not path.is_file():
        raise DraftsmithError(f"SLURM template {path} not found (draftsmith's templates live in {TEMPLATES})")
    return path


def render(template: Path, values: dict[str, object]) -> str:
    """``template`` with every ``{{name}}`` replaced by ``values[name]``; an unknown name is an error."""
    text = template.read_text()
    missing = sorted({m for m in PLACEHOLDER.findall(text) if m not in values})
    if missing:
        raise DraftsmithError(f"{template}: no value for {', '.join('{{' + m + '}}' for m in missing)}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def command(args: list[str]) -> str:
    """A shell-quoted argument list."""
    return " ".join(shlex.quote(str(a)) for a in args)
