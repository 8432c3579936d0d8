"""The recipe's fit on a device from a packed corpus, without ``datasets`` or ``jsonargparse`` (the GPU machine's image
lacks both): the corpus's rows batched as ``GeneratedDataModule`` batches them, the recipe's ``DrafterModule`` seeded
as LightningCLI seeds it, a Lightning ``Trainer`` and a token counter. ``gpu_check.py --corpus`` (``fit_on_corpus``),
the device check (``gpu_fit_check.py``) and the peers' GPU comparison (``peers_gpu.py``) fit with it."""

from __future__ import annotations

import argparse
import csv
import io
import math
import time
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from draftsmith.train.data import LengthBucketSampler, collate, count_generated, generated_prefix


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PackedData(L.LightningDataModule):
    """A packed corpus's first rows as a Lightning data module without ``datasets`` (the device's image lacks it):
    batched as ``GeneratedDataModule`` batches them (length buckets, ``collate`` at ``max_length``, seed 0)."""

    cache = None  # no feature cache: the target runs in every step

    def __init__(self, train: dict, val: dict, batch_size: int, max_length: int) -> None:
        super().__init__()
        self.train, self.val, self.batch_size, self.max_length = train, val, batch_size, max_length

    def check_target(self, target) -> None:  # the fingerprints are recorded beside the result instead
        pass

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        return count_generated(zip(self.train["input_ids"], self.train["loss_mask"], strict=True), vocab_size)

    def loader(self, columns: dict, shuffle: bool) -> DataLoader:
        rows = [
            {"input_ids": i, "loss_mask": m} for i, m in zip(columns["input_ids"], columns["loss_mask"], strict=True)
        ]
        sampler = LengthBucketSampler([len(r["input_ids"]) for r in rows], self.batch_size) if shuffle else None
        return DataLoader(rows, batch_size=self.batch_size, sampler=sampler,
                          collate_fn=partial(collate, max_length=self.max_length))  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.val, shuffle=False)


class TokenCounter(L.Callback):
    """Tokens (attention-mask positions) of the batches trained, the seconds from the end of the first step to the
    end of the last (``steady``: tokens/s with the first step's set-up and warm-up left out), and the first step whose
    loss is not finite (checked every ``every`` steps: the fit stops there instead of spending the device's time)."""

    def __init__(self, every: int = 10) -> None:
        self.every, self.count, self.first_count = every, None, None
        self.first = self.last = self.nonfinite_step = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        n = batch["attention_mask"].sum()  # summed on the device: no host sync a step
        self.count = n if self.count is None else self.count + n
        self.last = time.perf_counter()
        if self.first is None:
            if n.is_cuda:
                torch.cuda.synchronize()
            self.first, self.first_count = time.perf_counter(), n
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if trainer.global_step % self.every == 0 and not torch.isfinite(loss).item():
            self.nonfinite_step = trainer.global_step
            trainer.should_stop = True

    def on_train_end(self, trainer, module) -> None:
        if self.count is not None and self.count.is_cuda:
            torch.cuda.synchronize()
        self.last = time.perf_counter()

    @property
    def tokens(self) -> int:
        return int(self.count) if self.count is not None else 0

    def steady(self) -> float | None:
        if self.first is None or self.last <= self.first:
            return None
        return (self.tokens - int(self.first_count)) / (self.last - self.first)


def recipe_module(recipe: str, target: str, batch: int, steps: int | None = None) -> L.LightningModule:
    """The recipe's ``DrafterModule`` for ``target``, seeded as LightningCLI seeds a recipe's fit (without
    ``jsonargparse``, which the device's image lacks)."""
    from draftsmith.layers.module import EstimateConfig, OptimConfig
    from draftsmith.train.fit import FitRun, configure

    config = configure(recipe, FitRun(target=target, steps=steps, batch_size=batch))
    init = dict(config["model"]["init_args"])
    init["optim"] = OptimConfig(**{k: tuple(v) if k == "betas" else v for k, v in init.get("optim", {}).items()})
    init["estimate"] = EstimateConfig(**init.get("estimate", {}))
    module_name, name = config["model"]["class_path"].rsplit(".", 1)
    L.seed_everything(0, verbose=False)  # as LightningCLI seeds a recipe's fit, before the drafter's initialisation
    return getattr(__import__(module_name, fromlist=[name]), name)(**init)


def fit_on_corpus(target: str, device: str, args: argparse.Namespace, export: Path) -> dict:
    """The recipe's drafter (``--recipe``: network, loss, optimizer, schedule, clipping) trained by Lightning in bf16
    on the packed ``--corpus``'s shortest prefix holding ``--tokens`` generated tokens, ``--epochs`` passes, online
    (the target's forward in every step; no validation during the fit, ``--fit-minutes`` at most); then one
    validation on ``--val-corpus`` (``val/tau_est``). Saves the drafter to ``export``."""
    from draftsmith.core.manifest import file_sha256
    from draftsmith.core.native import save_native
    from draftsmith.data.packed import read_columns

    started = time.perf_counter()
    meta, columns = read_columns(args.corpus)
    rows, generated = generated_prefix(columns["loss_mask"], args.tokens)
    train = {k: columns[k][:rows] for k in ("input_ids", "loss_mask")}
    _, val = read_columns(args.val_corpus)
    steps = max(1, math.ceil(args.epochs * rows / args.fit_batch))  # scaling.fit_one's steps
    module = recipe_module(args.recipe, target, args.fit_batch, steps)
    data = PackedData(train, val, args.fit_batch, args.max_length)
    accelerator = "gpu" if device.startswith("cuda") else "cpu"
    precision = args.precision
    common = dict(accelerator=accelerator, devices=1, precision=precision, logger=False, enable_checkpointing=False,
                  enable_model_summary=False, enable_progress_bar=False)  # fmt: skip
    counter = TokenCounter()
    logs = CSVLogger(str(export.parent / "fit-log"), name="", version="")  # train/loss every 10 steps
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, gradient_clip_val=1.0, limit_val_batches=0,
                        num_sanity_val_steps=0, max_time={"minutes": args.fit_minutes}, callbacks=[counter],
                        **common | {"logger": logs}, log_every_n_steps=args.log_every)  # fmt: skip
    loaded = time.perf_counter()
    trainer.fit(module, datamodule=data)
    sync(device)
    fit_seconds = time.perf_counter() - loaded
    done = trainer.global_step
    val_trainer = L.Trainer(**common)
    metrics = val_trainer.validate(module, datamodule=data, verbose=False)[0]
    save_native(module.drafter, module.target, export, {"val_tau_est": metrics.get("val/tau_est")})
    tokens = sum(len(x) for x in train["input_ids"])
    steady = counter.steady()
    logs.finalize("success")
    metrics_csv = Path(logs.log_dir) / "metrics.csv"  # absent when the fit ended before its first record
    with open(metrics_csv) if metrics_csv.is_file() else io.StringIO("") as f:
        losses = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f) if r.get("train/loss")]
    out = {
        "recipe": args.recipe, "corpus": str(args.corpus), "corpus_sha256": file_sha256(args.corpus),
        "corpus_target": meta.get("target"),
        "target_fingerprint": module.target.fingerprint, "rows": rows, "generated_tokens": generated,
        "row_tokens": tokens, "steps": steps, "steps_done": done, "batch": args.fit_batch, "epochs": args.epochs,
        "precision": precision, "fit_seconds": round(fit_seconds, 1),
        "tokens_trained": counter.tokens, "tokens_per_s": round(counter.tokens / fit_seconds, 1),
        "steady_tokens_per_s": round(steady, 1) if steady else None, "first_nonfinite_step": counter.nonfinite_step,
        "train_loss": losses[:: max(1, len(losses) // 8)] + losses[-1:],
        "val_tau_est": metrics.get("val/tau_est"), "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    print(f"fit: {done}/{steps} steps in {fit_seconds:.1f} s; val tau_est {out['val_tau_est']}", flush=True)
    del module, trainer, val_trainer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out
