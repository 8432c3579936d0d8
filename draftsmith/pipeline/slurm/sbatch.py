"""The SLURM commands draftsmith runs: ``sinfo`` (partitions), ``sbatch`` (submit), ``scontrol`` (job state).

Every failure is a one-line ``DraftsmithError`` naming the command and what it said.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from draftsmith.errors import DraftsmithError

JOB_ID = re.compile(r"(\d+)(?:;\S+)?")
"""``sbatch --parsable`` prints ``<job id>`` or ``<job id>;<cluster>``."""


def require(name: str) -> str:
    """The path of SLURM command ``name``; a clear error where there is none."""
    tool = shutil.which(name)
    if tool is None:
        raise DraftsmithError(
            f"{name} not found on PATH: run this on a SLURM login node (or pass --dry-run to print the script)"
        )
    return tool


def _run(args: list[str]) -> str:
    tool = require(args[0])
    try:
        result = subprocess.run([tool, *args[1:]], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise DraftsmithError(f"{args[0]} did not answer within 60 s (is slurmctld up?)") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or f"exit status {result.returncode}").splitlines()
        raise DraftsmithError(f"{' '.join(args[:2])} failed: {said[-1]}")
    return result.stdout


def partitions() -> list[str]:
    """The cluster's partition names (``sinfo``; the default one without its ``*``)."""
    names = _run(["sinfo", "--noheader", "--format=%P"]).split()
    return sorted({name.rstrip("*") for name in names})


def parse_job_id(output: str) -> str:
    """The job id in ``sbatch --parsable`` output."""
    match = JOB_ID.fullmatch(output.strip())
    if match is None:
        raise DraftsmithError(f"sbatch printed {output.strip()!r}, not a job id")
    return match.group(1)


def submit(script: Path, dependency: list[str] | None = None) -> str:
    """``sbatch`` a rendered script, after all of ``dependency`` (job ids) succeeded; returns the job id."""
    args = ["sbatch", "--parsable"]
    if dependency:
        args.append("--dependency=afterok:" + ":".join(dependency))
    return parse_job_id(_run([*args, str(script)]))


def job_info(job_id: str) -> dict[str, str] | None:
    """``scontrol show job`` fields (``JobState``, ``Restarts``, ``ExitCode``, ...); None once SLURM forgot it."""
    tool = require("scontrol")
    result = subprocess.run([tool, "--oneliner", "show", "job", job_id], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return None
    fields = {}
    for item in result.stdout.split():
        key, eq, value = item.partition("=")
        if eq:
            fields[key] = value
    return fields
