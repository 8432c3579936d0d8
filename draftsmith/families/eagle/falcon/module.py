"""``FalconModule``: trains a Falcon drafter (``configs/falcon.yaml``) with Coupled Sequential Glancing Distillation.

CSGD, as implemented here (one step, blocks cut at a random one of the k alignments):

1. Pass 0 runs the block-causal layer on the real inputs (target features, real tokens): every block drafts the
   next one. Its top choices are compared with the real tokens; a block's errors are counted.
2. Pass 1 reads, at each block's next k rows, what drafting would feed it: the tokens pass 0 chose and the outputs
   that chose them, except at glanced rows, which get the ground truth (the real token and the target's
   feature). Each row of a block is glanced with probability ``glance * errors / k`` (as GLAT reveals
   ``glance * errors`` tokens: a drafter that errs more is shown more of the truth).
3. Both passes are trained: soft cross-entropy against the target's distribution plus EAGLE-1's feature regression
   (pass 1 weighted ``pass_decay``).

Simplifications: glancing draws each row independently (GLAT picks exactly round(glance * errors) of them), and
training unrolls two passes (deeper drafts read their own outputs untrained, as a 2-step training-time test does).
The paper's hand-designed decoding tree is replaced by the generic static (from the measured per-depth top-k
accuracies) and dynamic trees of ``layers/tree_draft.py``, which expand blocks the same way (see ``FalconDrafter``).
"""

from __future__ import annotations

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.falcon.network import FalconConfig, FalconModel, ahead
from draftsmith.layers.estimate import acceptance_prob, choice, choice_ahead
from draftsmith.layers.losses import feature_regression, masked_mean, soft_cross_entropy
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, shift


class FalconModule(DrafterModule):
    """Falcon training against a frozen target.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        block: tokens per drafter forward (the paper's k = 2).
        glance: GLAT's ratio: a block's pass-1 rows get the ground truth with probability glance * errors / k.
        pass_decay: weight of pass 1's losses.
        reg_weight: feature-regression weight.
        cls_weight: token-loss weight (0.1, as EAGLE).
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    def __init__(
        self,
        target: str,
        block: int = 2,
        glance: float = 0.5,
        pass_decay: float = 0.8,
        reg_weight: float = 1.0,
        cls_weight: float = 0.1,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if block < 1:
            raise DraftsmithError(f"model.block must be at least 1, got {block}")
        if glance < 0:
            raise DraftsmithError(f"model.glance must be at least 0, got {glance}")
        self.block = block
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()
        self.glance, self.pass_decay, self.reg_weight, self.cls_weight = glance, pass_decay, reg_weight, cls_weight

    def build_drafter(self) -> FalconModel:
        model = FalconModel(FalconConfig.for_target(self.target.config, self.block))
        model.init_from_target(self.target.embed_tokens.weight, self.target.lm_head.weight)
        return model

    def _glanced(self, wrong: torch.Tensor, alignment: int) -> torch.Tensor:
        """(B, L) pass-0 errors -> (B, L) rows whose pass-1 input is the ground truth."""
        k, length = self.block, wrong.shape[1]
        block = (torch.arange(length, device=wrong.device) + alignment) // k  # (L,)
        errors = torch.zeros(len(wrong), int(block[-1]) + 1, device=wrong.device).index_add_(1, block, wrong.float())
        share = (self.glance * errors[:, block] / k).clamp(max=1.0)  # (B, L)
        generator = None if self.training else torch.Generator(wrong.device).manual_seed(0)
        return torch.rand(share.shape, generator=generator, device=wrong.device) < share

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        net, k = self.drafter, self.block
        ids, valid, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
        alignment = int(torch.randint(k, ())) if self.training else 0
        length = ids.shape[1] + net.pads
        p = torch.softmax(out.logits.float(), -1)  # (B, T, V); row i predicts x_{i+1}
        feature = net.fuse(out.features)
        padded_valid = net.pad_valid(valid)

        tokens, hidden = net.first_inputs(ids, out.features)
        out0, k0, v0 = net.run(tokens, hidden, 0, alignment, padded_valid)
        logits0 = net.logits(out0)
        real_tokens, real_hidden = net.real_inputs(ids, out.features, 1)
        guess = logits0.detach().argmax(-1)  # pass 0's choice of the token real_tokens holds
        checkable = ahead(loss_mask, k - net.pads + 1, length).bool()
        glanced = self._glanced((guess != real_tokens) & checkable, alignment)
        tokens = torch.where(glanced, real_tokens, guess)
        hidden = torch.where(glanced[..., None], real_hidden, out0)
        out1, _, _ = net.run(tokens, hidden, 1, alignment, padded_valid, k0, v0)

        total, logs = 0.0, {"glanced": masked_mean(glanced.float(), checkable)}
        for s, (output, logits) in enumerate([(out0, logits0), (out1, net.logits(out1))]):
            n = (s + 1) * k - net.pads  # pass s's row r predicts x_{r+n+1}: target row r+n, feature f_{r+n}
            mask = ahead(loss_mask, n + 1, length).bool()
            logs[f"ce_{s}"] = masked_mean(soft_cross_entropy(logits, ahead(p, n, length)), mask)
            logs[f"reg_{s}"] = masked_mean(feature_regression(output, ahead(feature, n, length)), mask)
            total = total + self.pass_decay**s * (
                self.reg_weight * logs[f"reg_{s}"] + self.cls_weight * logs[f"ce_{s}"]
            )
        logs["loss"] = total
        return logs

    def _steps(self, batch: dict, out: TargetOutput, depth: int):
        """Per draft step d, (the drafter's logits (B, T, V) from each anchor, checkable (B, T))."""
        hidden = self.drafter.steps(batch["input_ids"], out.features, batch["attention_mask"], depth)
        for d, h in enumerate(hidden):  # step d from anchor t proposes x_{t+d+2}: target row t+d+1
            yield d, self.drafter.logits(h).float(), shift(batch["loss_mask"], d + 2).bool()

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        sampling = Sampling(self.estimate.temperature)
        p = choice(out.logits, sampling)
        accept, valid = [], []
        for d, logits, checkable in self._steps(batch, out, self.estimate.k):
            accept.append(acceptance_prob(choice_ahead(p, d + 1), choice(logits, sampling), sampling.greedy))
            valid.append(checkable)
        return torch.stack(accept), torch.stack(valid)

    @torch.no_grad()
    def step_ranks(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = out.logits.argmax(-1)  # row t's greedy token is the one verification accepts at t+1
        ranks, valid = [], []
        for d, logits, checkable in self._steps(batch, out, self.estimate.k):
            own = logits.gather(-1, shift(greedy, d + 1)[..., None])
            ranks.append((logits > own).sum(-1))
            valid.append(checkable)
        return torch.stack(ranks), torch.stack(valid)
