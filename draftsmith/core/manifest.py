"""The run manifest: what made an artifact (command, git SHA, package versions, target, seed), one function.

Every command that writes an artifact (``generate``, ``fit``, ``score``, ``export``, the quickstart, SLURM
submissions) records ``provenance()``; directories get it as ``manifest.json``. Multi-stage runs (the quickstart and
the training suite) reuse a stage's output by one rule, ``is_current``: its manifest, written last, records exactly
the inputs the stage would be run with now.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import draftsmith
from draftsmith.core.files import write_whole

PACKAGES = ("torch", "transformers", "datasets", "lightning", "peft", "safetensors", "jsonargparse")
"""Packages whose versions a manifest records (beside draftsmith's and Python's)."""
FILE = "manifest.json"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read a MiB at a time (a model or a corpus file may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_sha() -> str | None:
    """The short commit of the draftsmith checkout that runs, ``-dirty`` with uncommitted changes (None for an
    installed wheel or without git)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(Path(draftsmith.__file__).parent), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def versions() -> dict[str, str]:
    out = {"draftsmith": draftsmith.__version__, "python": platform.python_version()}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def provenance(target: dict | None = None, seed: int | None = None, command: list[str] | None = None) -> dict:
    """Command line (``sys.argv`` unless given), git SHA, versions, the target's fingerprint and the seed."""
    return {
        "command": shlex.join(sys.argv if command is None else command),
        "git": git_sha(),
        "versions": versions(),
        "target": target,
        "seed": seed,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _normal(value) -> object:
    """``value`` as JSON reads it back (paths as strings, tuples as lists), for comparing stage inputs."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def write_manifest(
    out: str | Path, target: dict | None = None, seed: int | None = None, stage: dict | None = None, **extra
) -> Path:
    """Write ``out/manifest.json``: ``provenance()`` plus ``extra``; ``stage``: the inputs ``is_current`` compares."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE
    record = provenance(target, seed) | extra | ({"stage": _normal(stage)} if stage is not None else {})
    write_whole(path, json.dumps(record, indent=2, default=str) + "\n")  # whole or absent: it marks the stage finished
    return path


def is_current(out: str | Path, stage: dict) -> bool:
    """The one reuse rule of multi-stage runs: ``out`` holds a finished stage made from exactly these inputs."""
    path = Path(out) / FILE
    try:
        return path.is_file() and json.loads(path.read_text()).get("stage") == _normal(stage)
    except json.JSONDecodeError:
        return False
