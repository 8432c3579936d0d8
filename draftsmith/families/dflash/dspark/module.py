"""``DSparkModule``: trains DSpark drafters (``configs/dspark.yaml``) on DFlash's training (``DFlashModule``).

The blocks are DFlash's (random anchors in training, every anchor in validation); each mask's logits carry the Markov
bias of the true previous token (teacher forcing: a position matters only when the drafts before it were accepted,
and then they were the target's tokens), distilled from the target like DFlash's (soft cross-entropy, weighted
``step_decay**d``). The confidence head learns each mask's acceptance probability: binary cross-entropy against
Σ min(p, q) of the target's p and the Markov-corrected q at temperature 1 (speculators' and SpecForge's signal, no
gradient through it), with the same weights, scaled by ``confidence_weight``.

``val/tau_est`` replays the verifier's rounds with the drafter's confidence cut: from each anchor the block is
proposed up to the last position whose survival (the product of the confidences read with the true previous tokens,
which are the drafted ones wherever the earlier drafts were accepted) is at least the threshold, as ``DSparkDrafter``
proposes it; on greedy data this is the verifier's τ exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.dflash.dspark.network import DSparkConfig, DSparkModel, check_heads
from draftsmith.families.dflash.module import DFlashModule
from draftsmith.layers.estimate import acceptance_prob
from draftsmith.layers.losses import masked_mean
from draftsmith.layers.module import EstimateConfig, OptimConfig, read_init
from draftsmith.layers.parallel import DepthLogits


@dataclass
class DepthHeads(DepthLogits):
    """One depth's Markov-corrected logits and the confidence head's logits there."""

    confidence: torch.Tensor
    """(B, n) confidence logits."""


class DSparkModule(DFlashModule):
    """A DSpark drafter trained against a frozen target.

    Args:
        target: local HF model directory of the target.
        feature_layers: target hidden_states indices fused into the context; default EAGLE-3's low, middle, high.
        depth: masks per block, the most tokens one forward drafts (K); None: the init's, else 4.
        num_layers: drafter layers.
        anchors: blocks per training row.
        mask_token_id: the id engines mark masks with; None: the rarest token of the training data.
        mask_from_token: the masks' embedding is the target's embedding of ``mask_token_id`` (frozen), as every peer's
            DSpark embeds them (required by every engine export); false: a learned mask embedding.
        markov_rank: r of the Markov head's previous-token bias.
        confidence_with_markov: the confidence head also reads the previous token's Markov embedding.
        confidence_weight: weight of the confidence head's loss (the peers' confidence_head_alpha).
        threshold: the confidence cut recorded with the drafter (``score`` can override it:
            ``confidence:T:DRAFTER``).
        init: a DSpark (its heads too) or a DFlash (the backbone; fresh heads) to go on from.
        step_decay: weight of mask d's losses is step_decay**d.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    init_methods = ("dspark", "dflash")

    def __init__(
        self,
        target: str,
        feature_layers: list[int] | None = None,
        depth: int | None = None,
        num_layers: int = 1,
        anchors: int = 64,
        mask_token_id: int | None = None,
        mask_from_token: bool = True,
        markov_rank: int = 256,
        confidence_with_markov: bool = True,
        confidence_weight: float = 1.0,
        threshold: float = 0.1,
        init: str | None = None,
        step_decay: float = 0.8,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if confidence_weight < 0:
            raise DraftsmithError(f"model.confidence_weight must be >= 0, got {confidence_weight}")
        heads = {"markov_rank": markov_rank, "confidence_with_markov": confidence_with_markov, "threshold": threshold}
        if init is not None:  # a DSpark start keeps its heads' shapes
            start = read_init(init, *self.init_methods)[0]
            if start["method"] == "dspark":
                heads |= {k: start["config"][k] for k in ("markov_rank", "confidence_with_markov")}
            if depth is None:
                depth = start["config"]["depth"]  # the init's depth, as DFlashModule keeps it (and records it)
        check_heads(DSparkConfig(**heads))  # before the target loads
        self.heads = heads
        self.confidence_weight = confidence_weight
        self._memo: list | None = None
        super().__init__(
            target, feature_layers, depth, num_layers, anchors, mask_token_id, mask_from_token, init, step_decay,
            optim, estimate,
        )  # fmt: skip

    def build_drafter(self) -> DSparkModel:
        if self.init is None:
            cfg = DSparkConfig.from_target(
                self.target.config, self.target.feature_layers, self.depth, self.num_layers, **self.heads
            )
            cfg.mask_token_id, cfg.mask_from_token = self.mask_token_id or 0, self.mask_from_token
            model = DSparkModel(cfg)
            model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
            return model
        from draftsmith.families.registry import extended, load_network

        start, _ = load_network(self.init, self.target)  # checked against the target
        model = start
        if start.method == "dflash":  # its backbone under fresh heads
            model = DSparkModel(extended(start.cfg, DSparkConfig, **self.heads))
            model.load_state_dict(start.state_dict(), strict=False)
        model.cfg.depth, model.cfg.mask_token_id, model.cfg.threshold = (
            self.depth,
            self.mask_token_id,
            self.heads["threshold"],
        )
        return model.train()

    def forward_depths(self, batch: dict, out: TargetOutput, train: bool) -> list[DepthHeads]:
        """DFlash's blocks through both heads; in a validation step computed once for its loss, estimate and ranks."""
        if not train and self._memo:
            return self._memo[0]
        ids, valid = batch["input_ids"], batch["attention_mask"]
        chunks = self.anchor_chunks(ids.shape[1] - 1, train)
        parts = [self.drafter.forward_heads(ids, out.features, valid, a.to(ids.device)) for a in chunks]
        logits, confidence = (torch.cat(x, dim=1) for x in zip(*parts, strict=True))
        anchors = torch.cat(chunks)
        levels = [DepthHeads(anchors, logits[:, :, d], confidence[:, :, d]) for d in range(self.depth)]
        if not train and self._memo is not None:
            self._memo.append(levels)
        return levels

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._memo = []
        try:
            super().validation_step(batch, batch_idx)
        finally:
            self._memo = None

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        levels = self.forward_depths(batch, out, self.training)
        logs = self.depth_losses(batch, out, levels)
        total = error = 0.0
        for d, level in enumerate(levels):
            target_logits, checkable = self._targets(batch, out, level, d)
            with torch.no_grad():  # the analytical acceptance of the Markov-corrected q at T = 1
                accept = acceptance_prob(
                    torch.softmax(target_logits.float(), -1), torch.softmax(level.logits.float(), -1), greedy=False
                ).clamp(0.0, 1.0)
            bce = F.binary_cross_entropy_with_logits(level.confidence.float(), accept, reduction="none")
            logs[f"conf_{d}"] = masked_mean(bce, checkable)
            total = total + self.step_decay**d * logs[f"conf_{d}"]
            error = error + masked_mean((torch.sigmoid(level.confidence.detach().float()) - accept).abs(), checkable)
        logs["confidence"] = total
        logs["confidence_error"] = error / len(levels)  # mean |predicted - actual acceptance| (speculators logs it)
        logs["loss"] = logs["loss"] + self.confidence_weight * total
        return logs

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """DFlash's per-step acceptance, with the steps past each anchor's confidence cut never accepted."""
        accept, valid = super().step_acceptance(batch, out)
        threshold = self.drafter.cfg.threshold
        if threshold > 0:
            levels = self.forward_depths(batch, out, False)[: self.estimate.k]
            survival = torch.stack([torch.sigmoid(level.confidence.double()) for level in levels]).cumprod(0)
            proposed = survival >= threshold  # (D, B, n); survival only falls, so a prefix
            proposed[0] = True  # a round drafts at least one token
            anchors = levels[0].anchors.to(accept.device)
            for d in range(len(levels)):
                accept[d][:, anchors] *= proposed[d].to(accept.dtype)
        return accept, valid
