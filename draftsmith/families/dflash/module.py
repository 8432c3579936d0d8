"""``DFlashModule``: trains DFlash-style block drafters (``configs/dflash.yaml``).

Each training row gets blocks at ``anchors`` random anchors (all of them in validation), each the committed
token plus ``depth`` masks seeing the context up to its anchor: one forward, every block's masks distilled from
the target's distributions of the tokens they stand for (soft cross-entropy, weighted ``step_decay**d``).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.dflash.network import DFlashConfig, DFlashModel
from draftsmith.layers.features import default_feature_layers
from draftsmith.layers.module import EstimateConfig, OptimConfig, read_init
from draftsmith.layers.parallel import DepthLogits
from draftsmith.layers.parallel_module import ParallelModule

EVAL_CHUNK = 64
"""Anchors per forward in validation (each adds a block of depth + 1 queries)."""
DEFAULT_DEPTH = 4
"""Masks per block of a fresh network (``depth``'s default without an ``init``)."""


class DFlashModule(ParallelModule):
    """A DFlash block drafter trained against a frozen target.

    Args:
        target: local HF model directory of the target.
        feature_layers: target hidden_states indices fused into the context; default EAGLE-3's low, middle, high.
        depth: masks per block, the tokens one forward drafts (K); None: the init's, else ``DEFAULT_DEPTH``.
        num_layers: drafter layers.
        anchors: blocks per training row (random anchors; fewer rows are cheaper).
        mask_token_id: the id engines mark masks with; None: the rarest token of the training data.
        mask_from_token: the masks' embedding is the target's embedding of ``mask_token_id`` (frozen) instead of a
            learned one: what speculators' DFlash computes, so required to export there (``export --to speculators``).
        init: a DFlash drafter (checkpoint or native dir, e.g. one ``draftsmith import`` made of a speculators or
            z-lab checkpoint) to go on from: its weights, layers, feature layers and masks (its depth unless ``depth``
            names another, its mask token unless ``mask_token_id`` does); None: a fresh network.
        step_decay: weight of mask d's loss is step_decay**d.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    init_methods: tuple[str, ...] = ("dflash",)
    """The methods ``init`` may hold."""

    def __init__(
        self,
        target: str,
        feature_layers: list[int] | None = None,
        depth: int | None = None,
        num_layers: int = 1,
        anchors: int = 64,
        mask_token_id: int | None = None,
        mask_from_token: bool = False,
        init: str | None = None,
        step_decay: float = 0.8,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if anchors < 1:
            raise DraftsmithError(f"model.anchors must be at least 1, got {anchors}")
        self.requested_layers, self.num_layers = feature_layers, num_layers
        self.mask_token_id, self.mask_from_token, self.init = mask_token_id, mask_from_token, init
        if init is not None:  # its record decides the feature layers before the target loads
            info = read_init(init, *self.init_methods)[0]
            start = info["config"]
            self.requested_layers, self.num_layers = list(start["feature_layers"]), start["num_layers"]
            self.mask_from_token = start["mask_from_token"]
            if mask_token_id is None:
                self.mask_token_id = start["mask_token_id"]
            if depth is None:
                depth = start["depth"]  # rebound before save_hyperparameters: a checkpoint records the depth it has
        if depth is None:
            depth = DEFAULT_DEPTH
        if depth < 1 or num_layers < 1:
            raise DraftsmithError(f"dflash: depth and num_layers must be at least 1, got {depth} and {num_layers}")
        self.depth = depth
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()
        self.anchors, self.step_decay = anchors, step_decay

    def feature_layers_for(self, target_path: str) -> tuple[int, ...]:
        if self.requested_layers:
            return tuple(self.requested_layers)
        config = AutoConfig.from_pretrained(target_path)
        return default_feature_layers(config.get_text_config(decoder=True).num_hidden_layers, 3)

    def build_drafter(self) -> DFlashModel:
        if self.init is not None:
            from draftsmith.families.registry import load_network

            model, _ = load_network(self.init, self.target)  # checked against the target
            model.cfg.depth, model.cfg.mask_token_id = self.depth, self.mask_token_id
            return model.train()
        cfg = DFlashConfig.from_target(self.target.config, self.target.feature_layers, self.depth, self.num_layers)
        cfg.mask_token_id, cfg.mask_from_token = self.mask_token_id or 0, self.mask_from_token
        model = DFlashModel(cfg)
        model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
        return model

    def prepare_from_data(self, datamodule) -> None:
        self.drafter.cfg.mask_token_id = self.placeholder_token(self.mask_token_id, datamodule)

    def forward_depths(self, batch: dict, out: TargetOutput, train: bool) -> list[DepthLogits]:
        """Blocks at random anchors (``anchors`` of them) in training, at every anchor (in chunks) otherwise: each
        stops one short of the row, as a block needs the committed token x_{a+1}."""
        ids, valid = batch["input_ids"], batch["attention_mask"]
        chunks = self.anchor_chunks(ids.shape[1] - 1, train)
        logits = torch.cat([self.drafter(ids, out.features, valid, a.to(ids.device)) for a in chunks], dim=1)
        anchors = torch.cat(chunks)
        return [DepthLogits(anchors, logits[:, :, d]) for d in range(self.depth)]

    def anchor_chunks(self, n: int, train: bool) -> list[torch.Tensor]:
        """The anchors of a row of n + 1 tokens, in the chunks one forward takes: ``anchors`` random ones (seeded by
        the step) in training, every one otherwise."""
        if train:
            generator = torch.Generator().manual_seed(self.global_step)
            return [torch.randperm(n, generator=generator)[: self.anchors].sort().values]
        return list(torch.arange(n).split(EVAL_CHUNK))
