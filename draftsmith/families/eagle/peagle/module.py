"""``PEagleModule``: trains P-EAGLE drafters (``configs/peagle.yaml``): EAGLE-3's network and draft vocabulary,
trained to draft ``depth`` positions in one forward with the parallel objective of ``layers/parallel.py``."""

from __future__ import annotations

import torch

from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.eagle.peagle.network import PEagleConfig, PEagleModel
from draftsmith.families.registry import extended
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, read_init
from draftsmith.layers.parallel import DepthLogits, parallel_layout, split_depths
from draftsmith.layers.parallel_module import ParallelModule


class PEagleModule(ParallelModule, EagleModule):
    """P-EAGLE training against a frozen target.

    Args:
        target: local HF model directory of the target.
        feature_layers: target hidden_states indices to fuse; default EAGLE-3's low, middle, high.
        draft_vocab_size: reduced vocabulary size (0 = the full target vocabulary).
        init: an EAGLE-3 or P-EAGLE drafter (checkpoint or native export, e.g. one ``draftsmith import`` made) to
            start from: its layer, fc, head and draft vocabulary, with its feature layers and vocabulary size (a
            P-EAGLE's placeholder feature and token too, unless ``mask_token_id`` names another); None: a fresh
            network.
        depth: tokens drafted per forward (K).
        mask_token_id: the placeholder's token id; None: the rarest token of the training data.
        keep_ratio: conditional token dropping: share of anchors trained at depth d is keep_ratio**d.
        step_decay: weight of depth d's loss is step_decay**d.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    last_real = 0  # anchor i pairs x_{i+1} with the feature of position i, at position i

    def __init__(
        self,
        target: str,
        feature_layers: list[int] | None = None,
        draft_vocab_size: int = 0,
        init: str | None = None,
        depth: int = 4,
        mask_token_id: int | None = None,
        keep_ratio: float = 0.5,
        step_decay: float = 0.8,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        self.check_settings(depth, keep_ratio)
        self.version, self.requested_layers, self.draft_vocab_size, self.depth = (
            3,
            feature_layers,
            draft_vocab_size,
            depth,
        )
        self.mask_token_id, self.init, self._start = mask_token_id, init, None
        if init is not None:  # its record decides the feature layers and vocabulary before the target loads
            self._start = read_init(init, "eagle3", "peagle")
            start_cfg = self._start[0].get("config", {})
            if self._start[0]["method"] == "peagle" and mask_token_id is None:
                self.mask_token_id = start_cfg["mask_token_id"]  # its placeholder feature was trained for it
            self.requested_layers = list(start_cfg["feature_layers"])
            self.draft_vocab_size = start_cfg["draft_vocab_size"]
        DrafterModule.__init__(self, target, optim, estimate)
        self.save_hyperparameters()
        self.keep_ratio, self.step_decay = keep_ratio, step_decay

    def build_drafter(self) -> PEagleModel:
        eagle3 = EagleConfig.from_target(self.target.config, 3, self.target.feature_layers, self.draft_vocab_size)
        model = PEagleModel(extended(eagle3, PEagleConfig, depth=self.depth, mask_token_id=self.mask_token_id or 0))
        model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
        if self._start is not None:
            from draftsmith.core.fingerprint import check_fingerprint

            check_fingerprint(self._start[0]["target"], self.target.fingerprint, f"model.init {self.init!r}")
            missing, unexpected = model.load_state_dict(self._start[1], strict=False)
            if [m for m in missing if m != "mask_hidden"] or unexpected:
                raise DraftsmithError(
                    f"model.init: {self.init} does not fit (missing {missing}, unexpected {unexpected})"
                )
        return model

    def prepare_from_data(self, datamodule) -> None:
        if self.init is None:
            super().prepare_from_data(datamodule)  # EAGLE-3's draft vocabulary (an init brings its own)
        self.drafter.cfg.mask_token_id = self.placeholder_token(self.mask_token_id, datamodule)

    def draft_ids(self) -> torch.Tensor:
        return self.drafter.draft_ids

    def depth_logits(self, batch: dict, out: TargetOutput, anchors: list[torch.Tensor]) -> list[DepthLogits]:
        ids = batch["input_ids"]
        layout = parallel_layout(batch["attention_mask"], anchors, self.last_real)
        logits = self.drafter.logits(self.drafter.parallel(ids, out.features, layout))
        real = DepthLogits(torch.arange(ids.shape[1], device=ids.device), logits[:, : ids.shape[1]])
        return [real] + [DepthLogits(a, x) for a, x in zip(anchors, split_depths(logits, layout), strict=True)]
