"""Callbacks the SLURM tests inject into ``draftsmith fit`` jobs (the job inherits the test's PYTHONPATH)."""

from __future__ import annotations

import json
import os
import time

import lightning as L


class StepLog(L.Callback):
    """Append ``{"restart", "rank", "step"}`` to ``out/steps.jsonl`` as each training step starts, then
    sleep ``delay`` seconds (so a test can signal the job while it is mid-run)."""

    def __init__(self, out: str, delay: float = 0.0) -> None:
        self.out = out
        self.delay = delay

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        record = {
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            "rank": trainer.global_rank,
            "step": trainer.global_step,
        }
        with open(os.path.join(self.out, "steps.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        time.sleep(self.delay)
