"""``draftsmith fit``: LightningCLI over any ``DrafterModule`` and ``GeneratedDataModule``."""

from __future__ import annotations

import os

from lightning.pytorch.cli import LightningCLI

from draftsmith.train.base import DrafterModule
from draftsmith.train.data import GeneratedDataModule

TRAINER_DEFAULTS = {
    "callbacks": [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"monitor": "val/tau_est", "mode": "max", "save_last": True, "filename": "best"},
        },
        {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor"},
    ],
    "logger": [
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs/fit"}},
    ],
    "gradient_clip_val": 1.0,
    "log_every_n_steps": 10,
}


def fit_main(args: list[str]) -> None:
    """Run ``LightningCLI`` in fit mode; wandb (when a recipe adds it) stays offline unless WANDB_MODE says so."""
    os.environ.setdefault("WANDB_MODE", "offline")
    LightningCLI(
        DrafterModule,
        GeneratedDataModule,
        subclass_mode_model=True,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=["fit", *args],
    )
