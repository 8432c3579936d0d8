"""The run manifest: what made an artifact (command, git SHA, package versions, target, seed), one function.

Every command that writes an artifact (``generate``, ``features``, ``fit``, ``score``, ``export``, the quickstart,
SLURM submissions) records ``provenance()``; directories get it as ``manifest.json``.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import draftsmith

PACKAGES = ("torch", "transformers", "datasets", "lightning", "peft", "safetensors", "jsonargparse")
"""Packages whose versions a manifest records (beside draftsmith's and Python's)."""
FILE = "manifest.json"


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


def write_manifest(out: str | Path, target: dict | None = None, seed: int | None = None, **extra) -> Path:
    """Write ``out/manifest.json``: ``provenance()`` plus ``extra`` (e.g. the resolved config)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE
    path.write_text(json.dumps(provenance(target, seed) | extra, indent=2, default=str) + "\n")
    return path
