"""What the fit loop adds to a training step: ``fit``'s steady-state step time over a bare loop of the same module's
forward + backward + optimizer step on the same batches.

    .venv/bin/python benchmarks/fit_loop.py [--steps 120] [--warmup 10] [--results fit_loop_NAME]

The shipped ``eagle3`` recipe (a one-layer EAGLE-3) on the toy ``default`` target, trained by the real
``draftsmith.train.fit.fit``: the LightningCLI trainer it builds, with every default callback (checkpoints, learning
rate monitor, ``FiniteGuard``, the text progress bar of a run whose output is not a terminal), the CSV and (offline)
wandb loggers and the recipe's data module. ``BareAlongside``, a callback of this fit, runs each step's batch through a
bare loop as well: a copy of the module made when the fit starts (the same weights; the frozen target shared), its
``losses`` on the same batch, ``backward``, clipping at the recipe's norm 1.0 and AdamW at the fit's learning rate of
that step, nothing else (no logging, no checks, no data loading: the batch is the one the fit loaded). The two are
interleaved step by step (the bare step before the fit's on even steps, after it on odd ones), so machine load falls
on both alike; the fit's step is the wall time from one ``on_train_batch_start`` to the next, less the bare step's.
Both learn the same thing: the bare copy's losses are recorded beside the fit's (``max_loss_gap``).

Validation runs after the last step only (its time is not a step's); the steps before ``--warmup`` are left out.
Ratios: the steady steps' total (throughput: periodic costs such as logging every 10 steps count) and the median of
the per-step ratios. Writes ``benchmarks/results/<--results>.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from common import machine, measured_on, write


def machine_tag() -> str:
    """This CPU in a word for the results' name: ``amx``, ``avx512``, ``avx2`` or its architecture."""
    from draftsmith.core.machine import cpu_info

    flags = cpu_info()["flags"]
    for tag, flag in (("amx", "amx_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return tag
    return os.uname().machine


class BareAlongside(L.Callback):
    """Each fit step's batch through a bare loop on a copy of the module, and both steps' times and losses."""

    last: BareAlongside | None = None
    """The instance of the last fit (the benchmark reads it after ``fit`` returns)."""

    def __init__(self, clip: float = 1.0) -> None:
        BareAlongside.last = self
        self.clip = clip
        self.fit_s: list[tuple[float, float]] = []  # (wall, this thread's CPU) seconds per step
        self.bare_s: list[tuple[float, float]] = []
        self.fit_loss: list[torch.Tensor] = []
        self.bare_loss: list[torch.Tensor] = []
        self._bare_total = (0.0, 0.0)  # spent in bare steps so far (taken off the fit's clocks)
        self._mark: tuple[float, float] | None = None
        self._lr = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        held = pl_module._trainer
        pl_module._trainer = None  # not copied along
        try:  # the same weights and draft vocabulary; the frozen target shared
            self.bare = copy.deepcopy(pl_module, memo={id(pl_module.target): pl_module.target})
        finally:
            pl_module._trainer = held
        self.bare.train()
        self.params = self.bare.trainable_parameters()
        o = pl_module.optim
        self.opt = torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)

    @staticmethod
    def _clocks() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def _fit_clock(self) -> tuple[float, float]:
        now = self._clocks()
        return now[0] - self._bare_total[0], now[1] - self._bare_total[1]

    def _bare_step(self, batch: dict) -> None:
        start = self._clocks()
        m = self.bare
        losses = m.losses(batch, m.target_forward(batch, m.loss_vocab()))
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        for group in self.opt.param_groups:
            group["lr"] = self._lr
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        end = self._clocks()
        seconds = (end[0] - start[0], end[1] - start[1])
        self.bare_s.append(seconds)
        self._bare_total = (self._bare_total[0] + seconds[0], self._bare_total[1] + seconds[1])
        self.bare_loss.append(losses["loss"].detach())

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        now = self._fit_clock()
        if self._mark is not None:
            self.fit_s.append((now[0] - self._mark[0], now[1] - self._mark[1]))
        self._lr = trainer.optimizers[0].param_groups[0]["lr"]  # this step's (the schedule steps after it)
        if trainer.global_step % 2 == 0:
            self._bare_step(batch)
        self._mark = self._fit_clock()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.fit_loss.append(loss.detach())  # read after the fit: no host sync here
        if (trainer.global_step - 1) % 2 == 1:
            self._bare_step(batch)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark = None  # a validation is not a step


def data(out: Path, prompts: int, new_tokens: int) -> tuple[Path, Path, Path]:
    """The toy target and its generated train / val data (made once)."""
    from draftsmith.targets import default as default_target
    from draftsmith.targets import resolve_target
    from draftsmith.train.suite import Budget, make_data

    target = default_target.build()
    train, val = make_data(
        resolve_target(target, quiet=True), out, Budget(train_prompts=prompts, new_tokens=new_tokens, score_prompts=8)
    )
    return target, train, val


def measure(args: argparse.Namespace) -> dict:
    from draftsmith.train.cli import CALLBACKS
    from draftsmith.train.fit import FitRun, fit

    if args.target:  # another target and its data (the mechanics, quickly)
        target, train, val = args.target, args.train, args.val
    else:
        target, train, val = data(args.work, args.prompts, args.new_tokens)
    callbacks = [*CALLBACKS, {"class_path": "fit_loop.BareAlongside"}]
    run = FitRun(
        target=str(target), train=str(train), val=str(val), out=args.work / "fit", steps=args.steps,
        trainer={"val_check_interval": args.steps, "callbacks": callbacks},
    )  # fmt: skip
    load = [round(os.getloadavg()[0], 2)]
    started = time.perf_counter()
    result = fit("eagle3", run)
    seconds = time.perf_counter() - started
    load.append(round(os.getloadavg()[0], 2))
    from fit_loop import BareAlongside as Instantiated  # the class LightningCLI imported (this file is __main__)

    bare = Instantiated.last
    w = args.warmup
    fit_s, bare_s = bare.fit_s[w:], bare.bare_s[w : len(bare.fit_s)]
    losses = [(float(a), float(b)) for a, b in zip(bare.fit_loss, bare.bare_loss, strict=False)]
    gaps = [abs(a - b) / max(abs(a), 1e-12) for a, b in losses]
    clocks = {}
    for c, clock in enumerate(("wall", "cpu")):
        f, b = [t[c] for t in fit_s], [t[c] for t in bare_s]
        clocks[clock] = {
            "fit_ms": {"median": round(1e3 * statistics.median(f), 2), "mean": round(1e3 * statistics.mean(f), 2)},
            "bare_ms": {"median": round(1e3 * statistics.median(b), 2), "mean": round(1e3 * statistics.mean(b), 2)},
            "ratio_total": round(sum(f) / sum(b), 3),
            "ratio_median": round(statistics.median(x / y for x, y in zip(f, b, strict=True)), 3),
        }
    return {
        "machine": machine(),
        "load": load,
        "recipe": "eagle3",
        "target": str(args.target or "default"),
        "steps": args.steps,
        "warmup": w,
        "steady_steps": len(fit_s),
        "fit_seconds": round(seconds, 1),
        "clocks": clocks,
        "max_loss_gap": max(gaps) if gaps else None,
        "best": str(result.best),
    }


def markdown(r: dict) -> str:
    lines = [
        "# The fit loop's cost per step: `fit` over a bare loop, toy target, one-layer EAGLE-3",
        "",
        f"{measured_on(r['machine'])}; load average before / after {r['load'][0]} / {r['load'][1]}. Steps "
        f"{r['warmup'] + 1}-{r['steps']} of {r['steps']} ({r['steady_steps']} intervals), the bare step and the fit's "
        "interleaved step by step on the same batches; wall time, and the training thread's CPU time (what load "
        "changes least; work off that thread, such as a DataLoader worker's, is not in it).",
        "",
        "| clock | `fit` ms / step (median, mean) | bare ms / step (median, mean) | `fit` / bare (totals) | "
        "`fit` / bare (median step) |",
        "|---|---|---|---|---|",
    ]
    for clock, c in r["clocks"].items():
        lines.append(
            f"| {clock} | {c['fit_ms']['median']}, {c['fit_ms']['mean']} | {c['bare_ms']['median']}, "
            f"{c['bare_ms']['mean']} | **{c['ratio_total']:.3f}×** | {c['ratio_median']:.3f}× |"
        )
    lines += [
        "",
        "`fit`: Lightning through `draftsmith.train.fit.fit`, its callbacks, loggers, progress bar and data loading; "
        "bare: forward, backward, clipping, AdamW (goal: `fit` ≤ 1.15× bare). The bare copy's losses stay within "
        f"{r['max_loss_gap']:.1e} (relative) of the fit's: the same training.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=400, help="training prompts the toy target continues")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--target", type=Path, help="a target dir instead of the toy one (with --train, --val)")
    parser.add_argument("--train", type=Path, help="--target's generated training data")
    parser.add_argument("--val", type=Path, help="--target's generated validation data")
    parser.add_argument("--work", type=Path, default=Path("runs/bench-fit-loop"))
    parser.add_argument("--results", default=None, help="results name under benchmarks/results (fit_loop_<cpu>)")
    args = parser.parse_args()
    args.results = args.results or f"fit_loop_{machine_tag()}"
    torch.set_num_threads(args.threads)
    r = measure(args)
    write(args.results, r, markdown(r))


if __name__ == "__main__":
    main()
