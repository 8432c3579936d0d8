"""``draftsmith slurm status RUN_DIR``: the state of the run's jobs and its last logged metrics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.slurm import sbatch
from draftsmith.pipeline.slurm.submit import RECORD

FIELDS = ("JobState", "Restarts", "RunTime", "ExitCode", "Reason")
"""``scontrol show job`` fields shown per job."""


def latest_metrics(run_dir: Path) -> tuple[Path | None, dict[str, str]]:
    """The newest ``csv/version_*/metrics.csv`` under ``run_dir`` and the last value logged in each column."""
    files = sorted(Path(run_dir).glob("**/csv/version_*/metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None, {}
    last: dict[str, str] = {}
    with files[-1].open() as f:
        for row in csv.DictReader(f):
            last.update({k: v for k, v in row.items() if v not in ("", None)})
    return files[-1], last


def job_states(run_dir: Path) -> list[dict]:
    """The latest submission of each job name in ``run_dir/jobs.json``, with its SLURM state."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        raise DraftsmithError(f"{run_dir}: no {RECORD}, so nothing was submitted from it with draftsmith slurm")
    latest: dict[str, dict] = {}
    for job in json.loads(path.read_text()):
        latest[job["name"]] = job
    rows = []
    for job in latest.values():
        info = sbatch.job_info(job["job_id"])
        state = {k: info.get(k, "") for k in FIELDS} if info else dict.fromkeys(FIELDS, "")
        if info is None:
            state["JobState"] = "UNKNOWN (no longer in slurmctld's memory; see sacct)"
        rows.append({"name": job["name"], "job_id": job["job_id"], **state})
    return rows


def status(run_dir: Path) -> dict:
    """Print the state of the jobs submitted from ``run_dir`` and the last metrics the training logged.

    Args:
        run_dir: a run dir of ``draftsmith slurm submit`` or ``draftsmith slurm pipeline``.

    Returns:
        ``{"jobs": [{name, job_id, JobState, Restarts, ...}], "metrics_file": ..., "metrics": {column: value}}``.
    """
    jobs = job_states(run_dir)
    metrics_file, metrics = latest_metrics(run_dir)
    width = max(len(j["name"]) for j in jobs)
    print(f"{'job':<{width}}  {'id':>8}  {'state':<10} restarts  runtime     exit  reason")
    for j in jobs:
        print(
            f"{j['name']:<{width}}  {j['job_id']:>8}  {j['JobState']:<10} {j['Restarts']:>8}  "
            f"{j['RunTime']:<10}  {j['ExitCode']:<4}  {j['Reason']}"
        )
    checkpoints = sorted(p.name for p in Path(run_dir).glob("**/hpc_ckpt_*.ckpt"))
    if checkpoints:
        print(f"requeue checkpoints: {', '.join(checkpoints)}")
    if metrics_file is None:
        print("no metrics logged yet")
    else:
        print(f"last metrics ({metrics_file}):")
        for key, value in metrics.items():
            print(f"  {key} = {value}")
    return {"jobs": jobs, "metrics_file": str(metrics_file) if metrics_file else None, "metrics": metrics}
