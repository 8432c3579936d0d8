"""Checkpoint and requeue on SLURM's warning signal, at a step boundary every rank agrees on.

Lightning's own SLURM handler (``_SignalConnector._slurm_sigusr_handler_fn``, lightning 2.6.6
``pytorch/trainer/connectors/signal_connector.py``) saves the checkpoint inside the signal handler,
i.e. wherever the main thread happens to be: possibly between ``backward`` and the optimizer step
(a checkpoint of a half-done step), and, under DDP, possibly while the other ranks are in a gradient
all-reduce (the checkpoint's barrier then meets the wrong collective). This callback's handler only
raises a flag; at the end of the next training batch the ranks OR their flags, all save the
checkpoint at the same step, and rank 0 runs ``scontrol requeue``. Because the callback's handler is
installed before the trainer registers its own, Lightning leaves SIGUSR1 to it.

The checkpoint is ``<default_root_dir>/hpc_ckpt_<N>.ckpt``, the name Lightning's checkpoint
connector resumes from by itself when ``ckpt_path`` is not given on SLURM (``_hpc_resume_path``
picks the highest N), so the requeued job continues at the saved step: no step lost or repeated.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn


def hpc_checkpoint_path(root: str | Path) -> Path:
    """The next ``hpc_ckpt_<N>.ckpt`` in ``root`` (N one above the highest there, from 1)."""
    found = [
        int(m.group(1))
        for p in Path(root).glob("hpc_ckpt_*.ckpt")
        if (m := re.fullmatch(r"hpc_ckpt_(\d+)\.ckpt", p.name))
    ]
    return Path(root) / f"hpc_ckpt_{max(found, default=0) + 1}.ckpt"


def job_id() -> str:
    """This job's id as ``scontrol requeue`` wants it (``<array job>_<task>`` for array jobs)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]


class RequeueOnSignal(L.Callback):
    """On ``signum`` (SLURM's ``--signal=USR1@<s>``), save an HPC checkpoint at the next step boundary,
    requeue the job and stop training.

    Args:
        signum: the signal's name, as in ``#SBATCH --signal``.
        requeue: run ``scontrol requeue`` (off: only checkpoint and stop).
    """

    def __init__(self, signum: str = "SIGUSR1", requeue: bool = True) -> None:
        self.signum = signal.Signals[signum if signum.startswith("SIG") else "SIG" + signum]
        self.requeue = requeue
        self.signalled = False
        self.saved: Path | None = None
        self._installed = False
        self._previous = None

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and SLURMEnvironment.detect():
            self._previous = signal.signal(self.signum, self._on_signal)
            self._installed = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._installed:
            signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        # every rank is on SLURM or none is, so either all take part in the reduction or none does
        if not self._installed or not trainer.strategy.reduce_boolean_decision(self.signalled, all=False):
            return
        self.signalled = False
        path = trainer.strategy.broadcast(hpc_checkpoint_path(trainer.default_root_dir))
        trainer.save_checkpoint(path)
        self.saved = Path(path)
        rank_zero_info(f"draftsmith: {self.signum.name} at step {trainer.global_step}: saved {path}")
        if self.requeue and trainer.is_global_zero:
            result = subprocess.run(["scontrol", "requeue", job_id()], capture_output=True, text=True)
            if result.returncode == 0:
                rank_zero_info(f"draftsmith: requeued SLURM job {job_id()}")
            else:
                rank_zero_warn(f"scontrol requeue {job_id()} failed: {result.stderr.strip()}")
        trainer.should_stop = True
