"""``ParallelModule``: training and the ``val/tau_est`` estimate of parallel drafters (``layers/parallel.py``), apart
from the drafting so that drafting imports no Lightning."""

from __future__ import annotations

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.layers.estimate import acceptance_prob, choice
from draftsmith.layers.losses import masked_mean, soft_cross_entropy
from draftsmith.layers.module import DrafterModule, shift
from draftsmith.layers.parallel import DepthLogits, keep_anchors, rarest_token


class ParallelModule(DrafterModule):
    """Training and the ``val/tau_est`` estimate for parallel drafters, over ``depth_logits``.

    Each depth's logits are distilled from the target's distribution of the token they predict (soft
    cross-entropy, weighted ``step_decay**d``); the estimate takes the same forward without dropping, which is
    exactly how the drafter drafts from every anchor.
    """

    depth: int
    """Draft positions per forward (D)."""
    keep_ratio: float = 1.0
    """Conditional token dropping: share of anchors kept at depth d is keep_ratio**d (training only)."""
    step_decay: float = 1.0
    """Weight of depth d's loss: step_decay**d."""
    last_real: int = 0
    """Anchor a's last real input sits at position a + last_real (``parallel_layout``)."""

    def check_settings(self, depth: int, keep_ratio: float) -> None:
        """One-line errors for the settings every parallel recipe has."""
        if depth < 1:
            raise DraftsmithError(f"model.depth must be at least 1, got {depth}")
        if not 0 < keep_ratio <= 1:
            raise DraftsmithError(f"model.keep_ratio must be in (0, 1], got {keep_ratio}")

    def placeholder_token(self, requested: int | None, datamodule=None) -> int:
        """The mask token: ``requested`` (checked to be a target id), else the training data's rarest token."""
        vocab = self.target.vocab_size
        if requested is None:
            return rarest_token(datamodule.token_counts(vocab))
        if not 0 <= requested < vocab:
            raise DraftsmithError(f"model.mask_token_id must be a token id below {vocab}, got {requested}")
        return requested

    def depth_logits(self, batch: dict, out: TargetOutput, anchors: list[torch.Tensor]) -> list[DepthLogits]:
        """Per depth 0..D-1, the drafter's logits from one forward (``anchors``: those kept at depths 1..D-1)."""
        raise NotImplementedError

    def draft_ids(self) -> torch.Tensor | None:
        """(Vd,) target id of each draft-vocabulary entry, or None for the target's whole vocabulary."""
        return None

    def forward_depths(self, batch: dict, out: TargetOutput, train: bool) -> list[DepthLogits]:
        """Every depth's logits from every anchor (``train``: with conditional token dropping), by default one
        ``depth_logits`` forward of the placeholder-chain layout."""
        n = batch["input_ids"].shape[1] - self.last_real
        ratio = self.keep_ratio if train else 1.0
        generator = torch.Generator().manual_seed(self.global_step) if train else None
        return self.depth_logits(batch, out, keep_anchors(n, self.depth, ratio, generator))

    def _targets(self, batch: dict, out: TargetOutput, level: DepthLogits, d: int, logits: torch.Tensor | None = None):
        """(the target's logits (B, n, V) for the token depth d predicts from each anchor, checkable (B, n));
        ``logits``: (B, T, V') to take them from instead of ``out.logits`` (e.g. the draft vocabulary's)."""
        logits = out.logits if logits is None else logits
        anchors = level.anchors.to(logits.device)
        row = (anchors + d + 1).clamp(max=logits.shape[1] - 1)  # target row a+d+1 predicts x_{a+d+2}
        label = anchors + d + 2
        mask = batch["loss_mask"].bool()
        in_range = label < mask.shape[1]
        checkable = mask[:, label.clamp(max=mask.shape[1] - 1)] & in_range[None]
        return logits[:, row], checkable

    def loss_vocab(self) -> torch.Tensor | None:
        return self.draft_ids()

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        return self.depth_losses(batch, out, self.forward_depths(batch, out, self.training))

    def depth_losses(self, batch: dict, out: TargetOutput, levels: list[DepthLogits]) -> dict[str, torch.Tensor]:
        """Each depth's soft cross-entropy against the target (``ce_{d}``) and their ``step_decay``-weighted sum
        (``loss``), over ``levels`` (one ``forward_depths``)."""
        ids = self.draft_ids()
        # the target's distribution restricted to the draft vocabulary, renormalised: softmax of those logits
        vocab_logits = out.logits if ids is None else out.logits_over(ids)  # (B, T, Vd)
        total, logs = 0.0, {}
        for d, level in enumerate(levels):
            logits, checkable = self._targets(batch, out, level, d, vocab_logits)
            p = torch.softmax(logits.float(), -1)
            ce = masked_mean(soft_cross_entropy(level.logits, p), checkable)
            logs[f"ce_{d}"] = ce
            total = total + self.step_decay**d * ce
        logs["loss"] = total
        return logs

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        ids = self.draft_ids()
        if ids is None:
            return logits.float()
        full = torch.full((*logits.shape[:-1], self.target.vocab_size), float("-inf"), device=logits.device)
        full[..., ids] = logits.float()
        return full

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        sampling = Sampling(self.estimate.temperature)
        b, t = batch["input_ids"].shape
        accept = torch.zeros(self.estimate.k, b, t, device=out.logits.device)
        valid = torch.zeros(self.estimate.k, b, t, dtype=torch.bool, device=out.logits.device)
        for d, level in enumerate(self.forward_depths(batch, out, False)[: self.estimate.k]):
            logits, checkable = self._targets(batch, out, level, d)
            q = choice(level.logits, sampling)
            accept[d][:, level.anchors] = acceptance_prob(
                choice(logits, sampling), q, sampling.greedy, self.draft_ids()
            )
            valid[d][:, level.anchors] = checkable
        for d in range(self.depth, self.estimate.k):  # deeper than it drafts: never accepted, still checkable
            valid[d] = shift(batch["loss_mask"], d + 2).bool()
        return accept, valid

    @torch.no_grad()
    def step_ranks(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = batch["input_ids"].shape
        ranks = torch.zeros(self.depth, b, t, dtype=torch.long, device=out.logits.device)
        checkable = torch.zeros(self.depth, b, t, dtype=torch.bool, device=out.logits.device)
        for d, level in enumerate(self.forward_depths(batch, out, False)):
            logits, ok = self._targets(batch, out, level, d)
            q = self._full(level.logits)
            token = logits.argmax(-1, keepdim=True)
            ranks[d][:, level.anchors] = (q > q.gather(-1, token)).sum(-1)
            checkable[d][:, level.anchors] = ok
        return ranks, checkable
