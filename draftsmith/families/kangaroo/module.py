"""``KangarooModule``: trains Kangaroo's adapter (``configs/kangaroo.yaml``, ``configs/smollm2/kangaroo.yaml``).

The adapter reads the target's hidden state after ``exit_layer`` layers (an online feature, computed under
``no_grad``) and is distilled from the target's next-token distribution at the same row through the target's frozen
LM head. The shallow layers are the target's, so along the real text the drafter's step j from anchor t is exactly
the adapter's row t+1+j: ``val/tau_est`` replays the verifier's rounds, early exit included.
"""

from __future__ import annotations

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.kangaroo.network import KangarooConfig, KangarooModel
from draftsmith.layers.estimate import acceptance_prob, choice
from draftsmith.layers.losses import masked_mean, soft_cross_entropy
from draftsmith.layers.module import DrafterModule, EstimateConfig, OptimConfig, shift
from draftsmith.layers.self_draft import decoder_of


class KangarooModule(DrafterModule):
    """Kangaroo's adapter on the target's first layers.

    Args:
        target: local HF model directory of the target (``default``: the embedded one).
        exit_layer: the shallow sub-network is the target's layers 0..exit_layer-1 (1 <= exit_layer < layers).
        threshold: drafting stops before the first token whose top-1 probability is below it (0: never).
        optim: optimizer and schedule.
        estimate: the ``val/tau_est`` estimate.
    """

    def __init__(
        self,
        target: str,
        exit_layer: int = 2,
        threshold: float = 0.6,
        optim: OptimConfig | None = None,
        estimate: EstimateConfig | None = None,
    ) -> None:
        if exit_layer < 1:
            raise DraftsmithError(f"model.exit_layer must be at least 1, got {exit_layer}")
        if not 0 <= threshold <= 1:
            raise DraftsmithError(f"model.threshold must be in [0, 1], got {threshold}")
        self.exit_layer, self.threshold = exit_layer, threshold
        super().__init__(target, optim, estimate)
        self.save_hyperparameters()

    def feature_layers_for(self, target_path: str) -> tuple[int, ...]:
        return (self.exit_layer,)

    def build_drafter(self) -> KangarooModel:
        decoder = decoder_of(self.target, "Kangaroo")
        layers = len(decoder.layers)
        if self.exit_layer >= layers:
            raise DraftsmithError(
                f"model.exit_layer must be below the target's {layers} layers (the drafter is its first layers), "
                f"got {self.exit_layer}"
            )
        cfg = KangarooConfig.from_target(self.target.config, self.target.vocab_size, self.exit_layer, self.threshold)
        model = KangarooModel(cfg)
        model.init_from_target(decoder.norm.weight)
        return model

    def adapter_logits(self, batch: dict, out: TargetOutput) -> torch.Tensor:
        """(B, T, V): row t is the drafter's distribution of x_{t+1} having read x_0..x_t."""
        hidden = out.features[0]
        b, t, _ = hidden.shape
        mask = torch.ones(t, t, dtype=torch.bool, device=hidden.device).tril()[None, None]
        mask = mask & batch["attention_mask"][:, None, None, :].bool()
        mask = mask | torch.eye(t, dtype=torch.bool, device=hidden.device)  # padded rows attend to themselves
        positions = torch.arange(t, device=hidden.device).expand(b, t)
        normed = self.drafter(hidden, positions, None, None, mask)[0]
        return self.target.final_logits(normed)

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        logits = self.adapter_logits(batch, out)
        p = torch.softmax(out.logits.detach().float(), -1)
        ce = masked_mean(soft_cross_entropy(logits, p), shift(batch["loss_mask"], 1).bool())
        return {"loss": ce, "ce": ce}

    @torch.no_grad()
    def step_acceptance(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor]:
        sampling = Sampling(self.estimate.temperature)
        logits = self.adapter_logits(batch, out).float()
        accept = acceptance_prob(choice(out.logits, sampling), choice(logits, sampling), sampling.greedy)  # (B, T)
        if self.threshold:
            confident = (torch.softmax(logits, -1).max(-1).values >= self.threshold).float()
        steps, valid = [], []
        for j in range(self.estimate.k):  # step j from anchor t: the adapter's row t+1+j predicts x_{t+2+j}
            a = shift(accept, j + 1)
            if j and self.threshold:  # a token below the threshold is not drafted (the first always is)
                a = a * shift(confident, j + 1)
            steps.append(a)
            valid.append(shift(batch["loss_mask"], j + 2).bool())
        return torch.stack(steps), torch.stack(valid)
