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


def test_validation_runs_the_target_once_a_fit_and_gives_what_running_it_gives(setup, tmp_path):  # noqa: F811
    """``DrafterModule.val_target_forward``: each validation batch's target states are kept from the first
    validation, so later validations do not run the target; what they read is what the online forward gives
    (features and logits, exactly, on this float32 target); a batch whose tokens differ is run again; a fit with
    the states kept logs the same validation metrics as one whose budget keeps none."""
    import torch
    from test_train import trainer

    model, data = module(setup, 3), datamodule(setup)
    data.setup()
    batches = list(data.val_dataloader())
    forwards, forward = [], model.target._forward
    model.target._forward = lambda **kw: forwards.append(1) or forward(**kw)  # counts the real forward's calls
    for i, batch in enumerate(batches):
        online = model.target_forward(batch)
        for _ in range(2):  # kept, then read back
            got = model.val_target_forward(batch, i)
            assert torch.equal(got.logits, online.logits)
            assert all(torch.equal(a, b) for a, b in zip(got.features, online.features, strict=True))
    assert len(forwards) == 2 * len(batches) and len(batches) >= 2  # the online one and the first kept one each
    other = batches[1]
    got = model.val_target_forward(other, 0)  # other tokens under batch 0's index: run, not batch 0's states
    assert torch.equal(got.logits, model.target_forward(other).logits)

    def fitted(kept_bytes: int) -> tuple[dict, int]:
        model, calls = module(setup, 3), []
        model.kept_target_bytes = kept_bytes
        forward = model.target._forward
        model.target._forward = lambda **kw: calls.append(kw["input_ids"].shape) or forward(**kw)
        fit = trainer(tmp_path, 6, val_check_interval=2, num_sanity_val_steps=0)
        fit.fit(model, datamodule(setup))
        return {k: v.item() for k, v in fit.callback_metrics.items() if k.startswith("val/")}, len(calls)

    kept, none = fitted(2**30), fitted(0)
    assert kept[0] == none[0] and "val/tau_est" in kept[0]  # the same validations, bit for bit
    assert none[1] - kept[1] == 2 * len(batches)  # 3 validations: the target ran in the first only
