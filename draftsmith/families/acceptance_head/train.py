"""Training a SpecDec++ acceptance head quickly, without a recipe: the quickstart's and the benchmarks' entry."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from draftsmith.core.machine import Device, local_device
from draftsmith.core.native import save_native
from draftsmith.families.acceptance_head.module import AcceptanceHeadModule
from draftsmith.layers.module import OptimConfig
from draftsmith.train.data import GeneratedDataModule


def train_head(
    target: str,
    drafter: str,
    train: str,
    val: str,
    out: str | Path,
    max_steps: int = 50,
    batch_size: int = 8,
    max_length: int = 256,
    steps: int = 6,
    lr: float = 2e-3,
    threshold: float = 0.5,
    device: Device | None = None,
) -> tuple[Path, dict[str, float]]:
    """Train an acceptance head quickly (no logger, no checkpoints) and export it as a native dir.

    On the default target's EAGLE-1, 50 steps reach a held-out AUROC of about 0.94 (200 steps: 0.97)
    in roughly a minute of two CPU cores. ``device``: where it trains (default: this machine's), on one device.

    Returns:
        the export dir (``--drafter NAME=DIR`` scores it) and its held-out metrics (loss, auroc, accept_rate).
    """
    model = AcceptanceHeadModule(
        target,
        drafter,
        steps=steps,
        threshold=threshold,
        optim=OptimConfig(lr=lr, warmup_steps=max(1, max_steps // 10)),
    )
    data = GeneratedDataModule(train, val, batch_size=batch_size, max_length=max_length)
    flags = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    device = device or local_device()  # one device: a head of a few thousand weights gains nothing from more
    place = {"accelerator": device.accelerator, "devices": 1, "precision": device.precision}
    trainer = L.Trainer(max_steps=max_steps, max_epochs=-1, gradient_clip_val=1.0, **place, **flags)
    trainer.fit(model, data)
    trainer.validate(model, data, verbose=False)
    metrics = {k.removeprefix("val/"): float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return save_native(model.drafter, model.target, out, {"drafter": str(drafter), "val": metrics}), metrics
