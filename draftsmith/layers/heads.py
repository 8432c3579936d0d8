"""``HeadsModule``: what Medusa and Hydra training share.

Both families give, at every anchor t (the position whose target state predicted x_{t+1}), one
set of logits per head i for x_{t+2+i}, computed teacher-forced on the real text. Losses, the
``val/tau_est`` acceptance and the top-k ranks follow from those logits alone: a head drafts
depth i+1 from the same anchor whatever was drafted before it (Medusa), or from the drafts
before it, which in any round that reaches depth i+1 equal the real tokens (Hydra).
"""

from __future__ import annotations

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.layers.estimate import acceptance_prob, choice, choice_ahead
from draftsmith.layers.losses import masked_mean, soft_cross_entropy
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, shift


class HeadsModule(DrafterModule):
    """Base of multi-head drafters. Subclasses implement ``head_logits``.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        num_heads: heads, i.e. the deepest draft.
        num_layers: residual blocks per head.
        head_decay: weight of head i's loss is head_decay**i (Medusa's λ_i).
        distill: train against the target's distribution at each predicted position (soft labels)
            instead of the data's tokens.
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    def __init__(
        self,
        target: str,
        num_heads: int = 4,
        num_layers: int = 1,
        head_decay: float = 0.8,
        distill: bool = False,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        self.num_heads, self.num_layers = num_heads, num_layers
        super().__init__(target, optim, estimate)
        self.head_decay, self.distill = head_decay, distill

    def head_logits(self, batch: dict, out: TargetOutput) -> torch.Tensor:
        """(num_heads, B, T, V): head i at anchor t predicts x_{t+2+i}."""
        raise NotImplementedError

    def _labels(self, batch: dict, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Head i's data tokens (B, T) and where they are generated text (B, T)."""
        return shift(batch["input_ids"], i + 2), shift(batch["loss_mask"], i + 2).bool()

    def head_losses(self, batch: dict, out: TargetOutput, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        total, logs = 0.0, {}
        p = torch.softmax(out.logits.detach().float(), -1) if self.distill else None
        for i, head in enumerate(logits):
            labels, mask = self._labels(batch, i)
            if self.distill:  # target row t+i+1 predicts x_{t+i+2}
                ce = soft_cross_entropy(head, shift(p, i + 1))
            else:
                ce = torch.nn.functional.cross_entropy(head.flatten(0, 1).float(), labels.flatten(), reduction="none")
                ce = ce.view_as(labels)
            logs[f"ce_{i}"] = masked_mean(ce, mask)
            total = total + self.head_decay**i * logs[f"ce_{i}"]
        logs["loss"] = total
        return logs

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        return self.head_losses(batch, out, self.head_logits(batch, out))

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        sampling = Sampling(self.estimate.temperature)
        logits = self.head_logits(batch, out)
        p = choice(out.logits, sampling)
        accept, valid = [], []
        for i in range(min(self.estimate.k, len(logits))):
            accept.append(acceptance_prob(choice_ahead(p, i + 1), choice(logits[i], sampling), sampling.greedy))
            valid.append(self._labels(batch, i)[1])
        return torch.stack(accept), torch.stack(valid)

    @torch.no_grad()
    def step_ranks(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head_logits(batch, out)
        greedy = out.logits.argmax(-1)  # row t's greedy token is the one verification accepts at t+1
        ranks, valid = [], []
        for i, head in enumerate(logits):
            own = head.gather(-1, shift(greedy, i + 1)[..., None])
            ranks.append((head > own).sum(-1))
            valid.append(self._labels(batch, i)[1])
        return torch.stack(ranks), torch.stack(valid)
