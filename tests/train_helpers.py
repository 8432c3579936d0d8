"""Callbacks and modules the training tests inject into real fits (``draftsmith fit`` subprocesses, ``fit()``)."""

from __future__ import annotations

import json
import os
import signal

import lightning as L
import torch

from draftsmith.families.eagle.module import EagleModule


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


class Poisoned(EagleModule):
    """The real EAGLE module, poisoned from optimizer step ``from_step`` (0-based ``global_step``): its loss times
    NaN, or, with ``grad_of``, only that parameter's gradient (a hook on it; the loss stays finite)."""

    def __init__(self, *args, from_step: int = 0, grad_of: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.from_step, self.grad_of = from_step, grad_of
        if grad_of is not None:
            self.get_parameter(grad_of).register_hook(self._poison_grad)

    def _poison_grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan") if self.global_step >= self.from_step else grad

    def losses(self, batch: dict, out) -> dict[str, torch.Tensor]:
        losses = super().losses(batch, out)
        if self.training and self.grad_of is None and self.global_step >= self.from_step:
            losses["loss"] = losses["loss"] * float("nan")
        return losses
