"""``FiniteGuard``: no silent dead drafter. Every ``DrafterModule`` fit runs it (``DrafterModule.configure_callbacks``).

One non-finite gradient element is enough to kill a drafter: ``clip_grad_norm_`` returns NaN and scales every
gradient by it, and AdamW then turns every parameter NaN. The fit used to go on to its last step, its checkpoints
(``best.ckpt`` too) held the NaN drafter and its ``val/tau_est`` still read a plausible ~1.05, since the argmax of
NaN logits is a token. The guard checks each step's loss and gradients before the optimizer applies them and stops
the fit at the first non-finite one with one line (a ``DraftsmithError``), keeping the checkpoints written before it;
it refuses to resume from, or write, a checkpoint holding a non-finite tensor; and it says, at the validation that
shows it, when ``val/tau_est`` has not risen above ``LEARNED_TAU`` (``did_not_learn``).
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

from draftsmith.errors import DraftsmithError
from draftsmith.layers.estimate import did_not_learn


def first_non_finite(tensors: dict) -> tuple[str | None, int, int]:
    """The first key whose tensor (in nested dicts and lists too) holds a non-finite value, how many do, of how
    many floating-point tensors."""
    first, bad, total = None, 0, 0
    stack = list(tensors.items())[::-1]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{key}.{k}", v) for k, v in value.items()][::-1]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{key}.{i}", v) for i, v in enumerate(value)][::-1]
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            total += 1
            if not bool(torch.isfinite(value).all()):
                bad += 1
                first = first or str(key)
    return first, bad, total


class FiniteGuard(L.Callback):
    """Stops a fit at its first non-finite loss or gradient before the optimizer applies it, in one line naming
    the step, the loss terms, the first parameter whose gradient is non-finite and the last (finite) checkpoint
    kept; refuses non-finite checkpoints (resume, writing); says when ``val/tau_est`` shows no learning.

    Args:
        every: check on the host every this many steps. None: every step on a CPU (free there), every logging
            interval elsewhere (a check is a device sync): between checks a faulty step's gradients are zeroed on
            the device so its update is never applied, the first one is remembered there, and the fit stops at the
            next check, or before any checkpoint is written, naming it.
    """

    _every, _first, _saved_step = 1, None, None

    def __init__(self, every: int | None = None) -> None:
        self.every = every
        self.taus: list[tuple[int, float]] = []
        """``val/tau_est`` at each validation: (step, τ)."""
        self.did_not_learn: str | None = None
        """Why the drafter did not learn (``layers.estimate.did_not_learn``), or None."""

    # -- the steps ----------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        cpu = pl_module.device.type == "cpu"
        self._every = self.every or (1 if cpu else max(1, trainer.log_every_n_steps))
        sharded = isinstance(trainer.strategy, (DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy))
        scaled = isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision_plugin.scaler is not None
        self._grads = not sharded and not scaled  # fp16's scaler skips non-finite steps itself; shards: loss only
        self._loss_ok: torch.Tensor | None = None
        self._terms: dict[str, torch.Tensor] = {}
        self._first: dict | None = None  # deferred checks: the first faulty step, kept on the device
        self._saved_step: int | None = None  # the global step of the last checkpoint written
        self._params = list(pl_module.named_parameters())  # walked once: a step reads the ones with a gradient

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        ok = torch.isfinite(loss.detach())
        self._loss_ok = ok if self._loss_ok is None else self._loss_ok & ok
        self._terms = getattr(pl_module, "step_losses", None) or {"loss": loss.detach()}

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        named = [(n, p.grad) for n, p in self._params if p.grad is not None] if self._grads else []
        device = pl_module.device
        # one fused norm per gradient: non-finite exactly where the gradient holds a non-finite element
        norms = torch._foreach_norm([g for _, g in named], dtype=torch.float32) if named else []
        finite = torch.isfinite(torch.stack(norms)) if norms else torch.ones(0, dtype=torch.bool, device=device)
        ok = finite.all()
        if self._loss_ok is not None:
            ok = ok & self._loss_ok.to(device)
        self._loss_ok = None
        names, step = ([n for n, _ in named], list(self._terms)), trainer.global_step
        if self._every == 1:
            if not bool(ok):
                raise self._stopped(trainer, step, names, self._term_values(device).tolist(), finite.tolist())
            return
        terms = self._term_values(device)
        for _, g in named:  # the update of a faulty step is never applied (without a sync: zeroed on the device)
            g.masked_fill_(~ok, 0.0)
        first = self._first
        if first is not None and (first["names"] != names or first["terms"].shape != terms.shape):
            self._check(trainer)  # the parameters or terms changed: settle the record kept so far
            first = None
        if first is None:
            none = torch.tensor(-1, device=device)
            first = self._first = {"names": names, "step": none, "terms": terms.clone(), "finite": finite.clone()}
        new = ~ok & (first["step"] < 0)
        first["step"] = torch.where(new, step, first["step"])
        first["terms"] = torch.where(new, terms, first["terms"])
        first["finite"] = torch.where(new, finite, first["finite"])

    def _term_values(self, device: torch.device) -> torch.Tensor:
        """(L,) the step's loss terms."""
        return torch.stack([v.detach().float().to(device).reshape(()) for v in self._terms.values()])

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if self._every > 1 and trainer.global_step % self._every == 0:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        """Deferred checks: stop the fit if a step since the last check was faulty (one device sync)."""
        first = self._first
        if first is None or int(first["step"]) < 0:
            return
        step, terms, finite = int(first["step"]), first["terms"].tolist(), first["finite"].tolist()
        raise self._stopped(trainer, step, first["names"], terms, finite, deferred=True)

    def _stopped(
        self,
        trainer: L.Trainer,
        step: int,
        names: tuple[list[str], list[str]],
        terms: list,
        finite: list,
        deferred: bool = False,
    ) -> DraftsmithError:
        """The one line of a stop at 0-based ``step``, found then or (``deferred``) at a later check."""
        params, term_names = names
        losses = ", ".join(f"{n} {v:.4g}" for n, v in zip(term_names, terms, strict=True))
        bad = [n for n, f in zip(params, finite, strict=True) if not f]
        what = "non-finite gradient" if all(map(math.isfinite, terms)) else "non-finite loss"
        grads = f"first non-finite gradient: {bad[0]} ({len(bad)} of {len(params)} parameters have one)" if bad else (
            "every gradient finite" if params else "gradients not checked (sharded or loss-scaled)"
        )  # fmt: skip
        of = f" of {trainer.max_steps}" if trainer.max_steps > 0 else ""
        head = (
            f"fit stopped after step {trainer.global_step}{of} (checked every {self._every}): step {step + 1} had a "
            f"{what}, its update not applied"
            if deferred
            else f"fit stopped at step {step + 1}{of}, before applying it: {what}"
        )
        return DraftsmithError(f"{head} ({losses}); {grads}; {self._kept(trainer)}")

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _kept(self, trainer: L.Trainer) -> str:
        """The last checkpoint written (all of them finite) or that none was, for the stop's line."""
        paths = [
            Path(p)
            for cb in trainer.checkpoint_callbacks
            for p in (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", ""))
            if p and Path(p).is_file()
        ]
        saved = getattr(self, "_saved_step", None)
        if paths and saved is not None:
            newest = max(paths, key=lambda p: p.stat().st_mtime)
            return f"kept {newest} (after step {saved}), nothing written after it"
        if trainer.ckpt_path:
            return f"kept {trainer.ckpt_path}, which it resumed from; nothing written after it"
        return "no checkpoint was written before it"

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """No checkpoint after a faulty step, and none holding a non-finite tensor (``best.ckpt`` included)."""
        if self._every > 1:
            self._check(trainer)
        name, bad, total = first_non_finite(checkpoint["state_dict"])
        if name is not None:
            raise DraftsmithError(
                f"fit stopped at step {trainer.global_step}: {bad} of {total} tensors of the drafter are non-finite "
                f"(first: {name}), not written; {self._kept(trainer)}"
            )
        self._saved_step = checkpoint["global_step"]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Refuse to resume from a checkpoint holding a non-finite tensor (weights or optimizer state)."""
        name, bad, total = first_non_finite({"state_dict": checkpoint.get("state_dict", {})})
        if name is None:
            name, bad, total = first_non_finite({"optimizer": checkpoint.get("optimizer_states", [])})
        if name is not None:
            raise DraftsmithError(
                f"resume: {trainer.ckpt_path} holds non-finite values ({name.removeprefix('state_dict.')}: {bad} of "
                f"{total} tensors), what a fit that diverged leaves; resume from an earlier checkpoint or start afresh"
            )

    # -- learning ----------------------------------------------------------------------------------------------
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tau = trainer.callback_metrics.get("val/tau_est")
        if trainer.sanity_checking or tau is None:
            return
        self.taus.append((trainer.global_step, float(tau)))
        self._judge(trainer, did_not_learn(self.taus))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._every > 1:
            self._check(trainer)
        self._judge(trainer, did_not_learn(self.taus, ended=True))

    def _judge(self, trainer: L.Trainer, why: str | None) -> None:
        """Say in one line when the fit turns out not to learn (once; a fit that recovers is no longer marked)."""
        said, self.did_not_learn = self.did_not_learn, why
        if why and not said and trainer.is_global_zero:
            line = f"fit {trainer.default_root_dir}: {why}: the drafter did not learn"
            bar = trainer.progress_bar_callback
            bar.print(line) if bar is not None else print(line, flush=True)

    def state_dict(self) -> dict:
        return {"taus": self.taus}

    def load_state_dict(self, state_dict: dict) -> None:
        self.taus = [tuple(t) for t in state_dict.get("taus", [])]
