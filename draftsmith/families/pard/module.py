"""``PardModule``: trains a PARD parallel draft LM (``configs/pard.yaml``).

The student starts from a draft LM (a ``draft_lm`` checkpoint or native export, or any HF causal LM sharing the
target's tokenizer) or fresh. The mask token is the target vocabulary's rarest token in the training data (or
``mask_token_id``); its embedding row starts at the mean embedding. From a PARD (a ``pard`` checkpoint or native dir,
e.g. one ``draftsmith import`` made of a PARD release) training goes on with its placeholder token and embedding as
they are.
Every anchor of a training sequence predicts the next ``depth`` tokens in one forward (``layers/parallel.py``),
distilled from the target's distributions; conditional token dropping keeps ``keep_ratio**d`` of the anchors at
depth d.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.core.target import TargetOutput
from draftsmith.families.pard.network import PardConfig, PardNetwork
from draftsmith.families.student import StudentShape, fresh_config, load_student
from draftsmith.layers.module import EstimateConfig, OptimConfig
from draftsmith.layers.parallel import DepthLogits, parallel_layout, split_depths
from draftsmith.layers.parallel_module import ParallelModule


class PardModule(ParallelModule):
    """A PARD draft LM trained against a frozen target.

    Args:
        target: local HF model directory of the target (``default``: the embedded default target).
        init: the student's start: a draft LM or PARD checkpoint / native export or an HF causal-LM dir; None: a
            fresh ``shape``.
        shape: the fresh student's shape (ignored with ``init``).
        depth: tokens drafted per forward (K).
        mask_token_id: the placeholder's token id; None: the rarest token of the training data.
        keep_ratio: conditional token dropping: share of anchors trained at depth d is keep_ratio**d.
        step_decay: weight of depth d's loss is step_decay**d.
        seed: seeds the fresh student's init.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    last_real = 1  # anchor a's last real input is x_{a+1}, at position a + 1

    def __init__(
        self,
        target: str,
        init: str | None = None,
        shape: StudentShape | None = None,
        depth: int = 4,
        mask_token_id: int | None = None,
        keep_ratio: float = 0.5,
        step_decay: float = 1.0,
        seed: int = 0,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        self.check_settings(depth, keep_ratio)
        self.init, self.shape, self.seed, self.depth = init, shape or StudentShape(), seed, depth
        self.mask_token_id = mask_token_id
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()
        self.keep_ratio, self.step_decay = keep_ratio, step_decay

    def build_drafter(self) -> PardNetwork:
        start = self.pard_start()
        if start is not None:  # a PARD: its student and placeholder (embedding row untouched) unless told otherwise
            network = PardNetwork(PardConfig(start.cfg.hf_config, start.cfg.mask_token_id, self.depth), start.model)
            if self.mask_token_id is None:
                self.mask_token_id = start.cfg.mask_token_id  # not chosen again from the data
            elif self.mask_token_id != start.cfg.mask_token_id:
                self.set_mask_token(network, self.mask_token_id)
            return network
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            if self.init is None:
                from transformers import AutoConfig, AutoModelForCausalLM

                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fresh_config(self.target, self.shape)))
            else:
                model = load_student(Path(self.init), self.target)
        hf_config = json.loads(model.config.to_json_string(use_diff=False))
        network = PardNetwork(PardConfig(hf_config, 0, self.depth), model.train())
        if self.mask_token_id is not None:
            self.set_mask_token(network, self.mask_token_id)
        return network

    def pard_start(self) -> PardNetwork | None:
        """The PARD network ``init`` names (a checkpoint or native dir of a ``pard`` drafter), else None."""
        from draftsmith.core.native import is_native
        from draftsmith.families.registry import load_network

        path = Path(self.init) if self.init else None
        if path is None or not (path.suffix == ".ckpt" or is_native(path)):
            return None
        network, info = load_network(path, self.target)
        return network.train() if info["method"] == "pard" else None

    def set_mask_token(self, network: PardNetwork, token: int) -> None:
        """Make ``token`` the placeholder, its embedding row reset to the mean of the others."""
        network.cfg.mask_token_id = token = self.placeholder_token(token)
        with torch.no_grad():
            embed = network.model.get_input_embeddings().weight
            others = torch.ones(len(embed), dtype=torch.bool, device=embed.device)
            others[token] = False
            embed[token] = embed[others].mean(0)

    def prepare_from_data(self, datamodule) -> None:
        if self.mask_token_id is None:
            self.set_mask_token(self.drafter, self.placeholder_token(None, datamodule))

    def depth_logits(self, batch: dict, out: TargetOutput, anchors: list[torch.Tensor]) -> list[DepthLogits]:
        ids = batch["input_ids"]
        layout = parallel_layout(batch["attention_mask"], anchors, self.last_real)
        masks = torch.full((len(ids), layout.mask.shape[-1] - ids.shape[1]), self.drafter.cfg.mask_token_id)
        logits = self.drafter(torch.cat([ids, masks.to(ids)], dim=1), layout)
        real = DepthLogits(torch.arange(ids.shape[1] - 1, device=ids.device), logits[:, 1 : ids.shape[1]])
        return [real] + [DepthLogits(a, x) for a, x in zip(anchors, split_depths(logits, layout), strict=True)]
