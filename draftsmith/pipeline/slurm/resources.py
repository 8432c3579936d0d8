"""What a job asks SLURM for, checked before anything is submitted."""

from __future__ import annotations

import re
from dataclasses import dataclass

from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.slurm import sbatch

TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
"""SLURM's ``--time`` forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (``man sbatch``)."""


@dataclass(frozen=True)
class Resources:
    """The allocation of one job (``#SBATCH`` lines of the rendered script)."""

    time: str
    """Time limit, as SLURM writes it: ``HH:MM:SS``, ``MM``, ``D-HH:MM:SS``, ..."""
    nodes: int = 1
    """Nodes; more than one renders ``pipeline/slurm/templates/fit_multinode.sbatch``."""
    gpus_per_node: int = 1
    """GPUs per node; 0 runs on CPUs (DDP over gloo)."""
    tasks_per_node: int | None = None
    """Processes per node (default: one per GPU, or 1 on CPU); each is a Lightning rank."""
    cpus_per_task: int | None = None
    """CPU cores per process (data loading, tokenization); default: the partition's."""
    partition: str | None = None
    """SLURM partition (default: the cluster's default partition)."""
    account: str | None = None
    """SLURM account to charge."""
    signal_s: int = 90
    """Seconds before the time limit at which SLURM sends SIGUSR1 (checkpoint + requeue)."""

    @property
    def tasks(self) -> int:
        """Processes per node."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return max(self.gpus_per_node, 1)

    @property
    def accelerator(self) -> str:
        return "gpu" if self.gpus_per_node else "cpu"

    def options(self, gpus: bool = True) -> str:
        """The optional ``#SBATCH`` lines (GPUs, CPUs, partition, account), one per line."""
        lines = []
        if gpus and self.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={self.gpus_per_node}")
        if self.cpus_per_task:
            lines.append(f"#SBATCH --cpus-per-task={self.cpus_per_task}")
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        if self.account:
            lines.append(f"#SBATCH --account={self.account}")
        return "\n".join(lines)


def time_seconds(value: str) -> int:
    """Seconds in a SLURM time limit; a malformed one is an error naming ``--time``."""
    match = TIME.fullmatch(value.strip())
    if match is None:
        raise DraftsmithError(
            f"--time {value!r} is not a SLURM time limit: use HH:MM:SS (or MM, MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)"
        )
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = a, b or 0, c or 0
    elif c is not None:  # H:M:S
        hours, minutes, seconds = a, b, c
    else:  # M or M:S
        hours, minutes, seconds = 0, a, b or 0
    if minutes >= 60 and (days is not None or c is not None) or seconds >= 60:
        raise DraftsmithError(f"--time {value!r}: minutes and seconds must be below 60")
    total = (((days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise DraftsmithError(f"--time {value!r} must be longer than zero")
    return total


def validate(r: Resources, check_cluster: bool) -> None:
    """Refuse what SLURM would refuse or run badly; with ``check_cluster``, ask ``sinfo`` about the partition."""
    for name in ("nodes", "tasks"):
        if getattr(r, name) < 1:
            flag = "--nodes" if name == "nodes" else "--tasks-per-node"
            raise DraftsmithError(f"{flag} must be at least 1, got {getattr(r, name)}")
    if r.gpus_per_node < 0:
        raise DraftsmithError(f"--gpus-per-node must be 0 (CPU) or more, got {r.gpus_per_node}")
    if r.cpus_per_task is not None and r.cpus_per_task < 1:
        raise DraftsmithError(f"--cpus-per-task must be at least 1, got {r.cpus_per_task}")
    limit = time_seconds(r.time)
    if not 0 < r.signal_s < limit:
        raise DraftsmithError(
            f"--signal-s {r.signal_s}: the checkpoint signal must come after the start and before the "
            f"--time limit ({r.time} = {limit} s)"
        )
    if check_cluster:
        sbatch.require("sbatch")
    if check_cluster and r.partition is not None:
        known = sbatch.partitions()
        if r.partition not in known:
            raise DraftsmithError(
                f"--partition {r.partition!r} is not a partition of this cluster (sinfo lists: "
                f"{', '.join(known) or 'none'})"
            )
