"""``DrafterModule``: the LightningModule every drafter family extends.

It holds a frozen ``Target`` (a plain attribute, so it is neither trained nor
saved in checkpoints) and a trainable drafter ``nn.Module``. Target logits and
features are computed online, under ``no_grad``, in each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import lightning as L
import torch

from draftsmith import targets
from draftsmith.core.machine import training_attention
from draftsmith.core.native import describe
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.layers.attention import document_mask
from draftsmith.layers.estimate import replay_rounds, tau_from_rounds
from draftsmith.layers.guard import FiniteGuard

TOPK = 10
"""Ranks whose held-out accuracy validation records, per depth (for static trees)."""


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio``."""

    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    warmup_ratio: float = 0.0
    """Linear warmup as a share of the fit's steps (the peers' form: speculators 1%, SpecForge 1.5%); when above 0 it
    sets the warm-up, at least 1 step, instead of ``warmup_steps``."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_ratio < 1:
            raise DraftsmithError(
                f"optim.warmup_ratio is a share of the fit's steps, in [0, 1): got {self.warmup_ratio:g}"
            )
        if self.warmup_steps < 0:
            raise DraftsmithError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise DraftsmithError(f"optim.min_lr_ratio is a fraction of optim.lr, in [0, 1]: got {self.min_lr_ratio:g}")


@dataclass(frozen=True)
class EstimateConfig:
    """The teacher-forced τ estimate logged as ``val/tau_est``."""

    k: int = 4
    """Chain length K the estimate is for (match the verifier's -k)."""
    temperature: float = 0.0
    """0: greedy acceptance (argmax match); > 0: sum(min(p, q)) at this temperature."""


def read_init(init: str, *methods: str) -> tuple[dict, dict]:
    """The native record and state of a ``model.init`` start, which must hold a drafter of one of ``methods`` (else
    one line naming what it holds)."""
    from draftsmith.core import native

    start = native.read(init)
    if start[0].get("method") not in methods:
        raise DraftsmithError(
            f"model.init: {init} holds a {start[0].get('method')} drafter, not {' or '.join(methods)}"
        )
    return start


def config_target(text: str) -> targets.ResolvedTarget:
    """A target as a fit's config carries it: ``DIR:DTYPE`` (``str`` of the ``ResolvedTarget`` the caller resolved)
    or, in a hand-written recipe, a user's ``NAME_OR_DIR[:DTYPE]``; the fit process's one place where a target
    string becomes a target (its families' other targets too: ``s2d``'s ``model.targets``)."""
    return targets.resolve_target(text)


class DrafterModule(L.LightningModule):
    """Base of the drafter LightningModules: frozen target, trainable ``self.drafter``.

    Subclasses implement ``feature_layers()``, ``build_drafter()``, ``losses()`` and
    ``step_acceptance()``.
    """

    def __init__(self, target: str, optim: OptimConfig | None = None, estimate: EstimateConfig | None = None):
        super().__init__()
        self.optim = optim or OptimConfig()
        self.estimate = estimate or EstimateConfig()
        # training runs the target on whole sequences, never one row: the fastest kernels, no batch invariance
        resolved = config_target(target)  # the fit's config carries it as a string (``DIR:DTYPE``)
        layers = self.feature_layers_for(str(resolved.path))
        self.target = targets.load_target(resolved, feature_layers=layers, batch_invariant=False)
        self.drafter = self.build_drafter()

    packs: bool = False
    """Whether the family trains on packed batches (``data.pack``: ``doc_ids`` / ``position_ids`` in the batch, read
    by its masks, positions and labels); the others refuse them."""

    # -- hooks for families ------------------------------------------------------------
    def feature_layers_for(self, target_path: str) -> tuple[int, ...]:
        return (-1,)

    def build_drafter(self) -> torch.nn.Module:
        raise NotImplementedError

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        """Named scalar losses; ``loss`` is the one optimised."""
        raise NotImplementedError

    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, B, T) acceptance probability of draft step j from anchor t (the drafter unrolled as it
        drafts; see ``layers/estimate.py``) and whether that step has a generated token to check."""
        raise NotImplementedError

    def step_ranks(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(D, B, T) rank of the target's token among the drafter's choices at depth d+1 from anchor t
        (0 = its top choice) and whether it is checkable; None if the family does not draft trees.
        Validation turns them into the per-depth top-k accuracies static trees are built from."""
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.drafter.parameters() if p.requires_grad]

    def prepare_from_data(self, datamodule) -> None:
        """Family-specific set-up that needs the training data (e.g. EAGLE-3's draft vocabulary)."""

    # -- Lightning -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        self.target.model.to(self.device)
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None:
            if getattr(getattr(datamodule, "hparams", None), "pack", False) and not self.packs:
                raise DraftsmithError(
                    f"data.pack: {type(self).__name__} does not train on packed batches (EAGLE-1 / EAGLE-3 do); "
                    "drop data.pack"
                )
            datamodule.check_target(self.target)
            if getattr(datamodule, "cache", None) is not None:
                self.target.check_final_logits("data.features")
            if stage == "fit":
                self.prepare_from_data(datamodule)

    def on_fit_start(self) -> None:
        self.target.model.to(self.device)
        training_attention(self.device)  # cuDNN's attention backward gives NaN gradients for some masked shapes

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """The recipes' clipping by norm, under FSDP too: Lightning's FSDP precision refuses it, so the norm over all
        shards is FSDP's own ``clip_grad_norm_``."""
        from lightning.pytorch.strategies import FSDPStrategy

        fsdp = isinstance(self.trainer.strategy, FSDPStrategy)
        if fsdp and gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Record what ``draftsmith score`` / ``export`` need to rebuild the drafter from this checkpoint alone."""
        checkpoint["draftsmith"] = describe(self.drafter, self.target)
        if self.topk_accuracy is not None:
            checkpoint["draftsmith"]["topk_accuracy"] = self.topk_accuracy

    def target_forward(self, batch: dict, vocab: torch.Tensor | None = None) -> TargetOutput:
        """The target's logits and features on ``batch``: run online, or read from the feature cache (``hidden``:
        the feature layers and the final normed state, whose LM head output is the target's logits). ``vocab``:
        from the cache, only these tokens' logits are computed (``TargetOutput.vocab``)."""
        if "hidden" not in batch:
            masks = self._target_masks(batch)
            if vocab is None or not self._logits_from_final_state():
                return self.target(batch["input_ids"], **masks)
            # online with a loss vocabulary: the LM head on those tokens only, from the final normed state
            layers = (*self.target.feature_layers, self.target.num_layers)
            out = self.target(batch["input_ids"], **masks, feature_layers=layers, last_logits_only=True)
            with torch.no_grad():
                logits = self.target.final_logits(out.features[-1], vocab)
            return TargetOutput(logits, out.features[:-1], vocab=vocab)
        hidden = batch["hidden"]
        with torch.no_grad():
            logits = self.target.final_logits(hidden[self.target.num_layers], vocab)
        return TargetOutput(logits, tuple(hidden[layer].float() for layer in self.target.feature_layers), vocab=vocab)

    def _target_masks(self, batch: dict) -> dict[str, torch.Tensor]:
        """The target's mask arguments for ``batch``: its padding mask, or for a packed batch (``doc_ids``) a 4D
        boolean block-causal mask (``document_mask``) and each document's positions from 0."""
        if "doc_ids" not in batch:
            return {"attention_mask": batch["attention_mask"]}
        if not self.packs:
            raise DraftsmithError(f"data.pack: {type(self).__name__} does not train on packed batches")
        impl = self.target.config._attn_implementation
        windows = [w for w in self.target.attention_windows.values() if w is not None]
        if impl != "sdpa" or windows:
            raise DraftsmithError(
                f"data.pack: the target's forward takes a packed batch's mask with sdpa attention and no sliding "
                f"window (it has {impl}{', windows ' + str(windows) if windows else ''}); train from a feature cache "
                "(data.features) or drop data.pack"
            )
        return {"attention_mask": document_mask(batch["doc_ids"]), "position_ids": batch["position_ids"]}

    def _logits_from_final_state(self) -> bool:
        """Whether the target's logits are its LM head on its final hidden state (checked once)."""
        if not hasattr(self, "_final_state_ok"):
            try:
                self.target.check_final_logits("training")
                self._final_state_ok = True
            except DraftsmithError:
                self._final_state_ok = False
        return self._final_state_ok

    def loss_vocab(self) -> torch.Tensor | None:
        """The token ids whose target logits ``losses`` reads (None: all); training from a feature cache then
        computes only those (a reduced-vocabulary drafter's loss never needs the rest)."""
        return None

    step_losses: dict[str, torch.Tensor] | None = None
    """The last training step's loss terms (detached), which ``FiniteGuard`` names when one turns non-finite."""

    def configure_callbacks(self) -> list[L.Callback]:
        """``FiniteGuard`` (``layers/guard.py``) on every fit, unless the trainer has one: a non-finite loss or gradient
        stops the fit before it is applied, and a drafter that does not learn is said so."""
        return [] if any(isinstance(c, FiniteGuard) for c in self.trainer.callbacks) else [FiniteGuard()]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self.losses(batch, self.target_forward(batch, self.loss_vocab()))
        self.step_losses = {k: v.detach() for k, v in losses.items()}
        if self.logging_step():
            self.log_dict(
                {f"train/{k}": v for k, v in losses.items()}, prog_bar=True, batch_size=len(batch["input_ids"])
            )
        return losses["loss"]

    def logging_step(self) -> bool:
        """Whether this training step's values reach the loggers (Lightning's rule: every ``log_every_n_steps``).
        The loss terms are logged in those steps only: in the others Lightning dropped them, after Python work each
        step and, with a progress bar drawn each step, a host sync on a GPU (benchmarks/fit_loop.py)."""
        trainer = self._trainer
        return trainer is None or trainer.fast_dev_run or trainer._logger_connector.should_update_logs

    topk_accuracy: list[list[float]] | None = None
    """Per depth, the held-out accuracy of each rank (< ``TOPK``), from the last validation."""

    def on_validation_epoch_start(self) -> None:
        self._val_rounds = torch.zeros(2, device=self.device)  # (tokens, rounds) of replayed verifier rounds
        self._val_ranks: torch.Tensor | None = None  # (D, TOPK + 1): hits per rank, checkable count last

    kept_target_bytes: int = 2 * 2**30
    """Host memory the target's validation states may keep (``val_target_forward``); batches past it run online."""

    def val_target_forward(self, batch: dict, batch_idx: int) -> TargetOutput:
        """``target_forward`` of validation batch ``batch_idx``, from the target's states that the fit's first
        validation kept: the held-out rows come in the same batches every validation and the target is frozen, so
        its forward, most of a validation's time (issue 86: 5 validations were 72 of a 130 s fit), runs once a
        fit. The states kept are those a feature cache holds (the feature layers and the final normed state, whose
        LM head output is the target's logits), in the target's dtype (the forward's values, exactly) on the host,
        up to ``kept_target_bytes``; each validation reads them back as a cached batch. A batch whose tokens differ
        from its kept one's is run again; targets whose logits are not their head's on that state always run."""
        if "hidden" in batch or type(self).target_forward is not DrafterModule.target_forward:
            return self.target_forward(batch)
        if not self._logits_from_final_state():
            return self.target_forward(batch)
        kept = self.__dict__.setdefault("_kept_target", {})
        ids = batch["input_ids"].cpu()
        if batch_idx in kept and torch.equal(kept[batch_idx][0], ids):
            hidden = kept[batch_idx][1]
        else:
            kept.pop(batch_idx, None)  # another batch's states: not counted against the budget
            layers = (*self.target.feature_layers, self.target.num_layers)
            out = self.target(
                batch["input_ids"], **self._target_masks(batch), feature_layers=layers, last_logits_only=True
            )
            dtype = self.target.model.dtype
            hidden = {layer: f.to("cpu", dtype) for layer, f in zip(layers, out.features, strict=True)}
            held = sum(h.nbytes for _, states in kept.values() for h in states.values())
            if held + sum(h.nbytes for h in hidden.values()) <= self.kept_target_bytes:
                kept[batch_idx] = (ids, hidden)
        return self.target_forward({**batch, "hidden": {layer: h.to(self.device) for layer, h in hidden.items()}})

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self.val_target_forward(batch, batch_idx)
        n = len(batch["input_ids"])
        self.log_dict({f"val/{k}": v for k, v in self.losses(batch, out).items()}, batch_size=n, sync_dist=True)
        accept, valid = self.step_acceptance(batch, out)
        rounds = replay_rounds(accept.cpu(), valid.cpu(), torch.Generator().manual_seed(batch_idx))
        self._val_rounds += torch.tensor(tau_from_rounds(rounds), device=self.device, dtype=torch.float)
        ranked = self.step_ranks(batch, out)
        if ranked is not None:
            ranks, checkable = ranked
            hits = torch.stack([((ranks == r) & checkable).sum((1, 2)) for r in range(TOPK)], dim=1)
            counts = torch.cat([hits, checkable.sum((1, 2))[:, None]], dim=1).float()
            self._val_ranks = counts if self._val_ranks is None else self._val_ranks + counts

    def on_validation_epoch_end(self) -> None:
        tokens, rounds = self.trainer.strategy.reduce(self._val_rounds, reduce_op="sum").tolist()
        if rounds:
            self.log("val/tau_est", tokens / rounds, prog_bar=True)
        if self._val_ranks is not None:
            counts = self.trainer.strategy.reduce(self._val_ranks, reduce_op="sum")
            accuracy = counts[:, :TOPK] / counts[:, TOPK:].clamp_min(1)
            self.topk_accuracy = [[round(a, 6) for a in row] for row in accuracy.tolist()]
            for d, row in enumerate(self.topk_accuracy):
                self.log(f"val/top1_acc_{d + 1}", row[0])

    def configure_optimizers(self):
        params = self.trainable_parameters()
        opt = torch.optim.AdamW(params, lr=self.optim.lr, betas=self.optim.betas, weight_decay=self.optim.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = warmup_steps(self.optim, total), self.optim.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def warmup_steps(optim: OptimConfig, total: int) -> int:
    """The warm-up of a fit of ``total`` steps: ``warmup_ratio`` of them (at least 1) when set, else ``warmup_steps``."""
    return max(1, round(optim.warmup_ratio * total)) if optim.warmup_ratio > 0 else optim.warmup_steps


def shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[:, s:] right-padded with zeros back to length T (so index i holds x[i + s])."""
    pad = torch.zeros_like(x[:, :s])
    return torch.cat([x[:, s:], pad], dim=1)
