"""Callbacks the training tests inject into real ``draftsmith fit`` subprocesses."""

from __future__ import annotations

import json
import os
import signal

import lightning as L


class KillAtStep(L.Callback):
    """SIGKILL this process (no clean-up of any kind) once ``step`` optimizer steps are done."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class RecordBatches(L.Callback):
    """Append each training row this rank sees (as a token list) to ``out/rank<R>.jsonl``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        rows = [
            ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
        ]
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(rows) + "\n")
