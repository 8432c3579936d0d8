"""The fit loop's per-step work: what a training step logs, and when (``benchmarks/fit_loop.py`` measures the loop)."""

from __future__ import annotations

import csv

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger
from test_train import datamodule, module, setup  # noqa: F401  (the module's toy target and its generated data)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_loss_terms_are_logged_in_the_logging_steps_only_and_all_reach_the_log(setup, tmp_path):  # noqa: F811
    """``DrafterModule.training_step`` logs its loss terms in the steps whose values reach the loggers (every
    ``log_every_n_steps``), not in every step (Python work each step, and a host sync a step on a GPU where a
    progress bar shows them); the log holds every one of those steps' terms, as before."""
    model, data = module(setup, 3), datamodule(setup)
    logged, log_dict = [], model.log_dict

    def counted(metrics: dict, **kwargs) -> None:
        logged.append(model.trainer.global_step)
        log_dict(metrics, **kwargs)

    model.log_dict = counted
    trainer = L.Trainer(max_steps=7, log_every_n_steps=3, logger=CSVLogger(tmp_path, name="csv"), accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0)  # fmt: skip
    trainer.fit(model, data)
    assert logged == [2, 5]  # the 3rd and 6th steps, of 7
    with open(next(tmp_path.glob("csv/version_*/metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == [2, 5]
    assert all(r["train/ce_0"] and r["train/ce_2"] for r in rows)
