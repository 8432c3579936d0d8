"""``AcceptanceHeadModule``: trains a SpecDec++ acceptance head on a frozen drafter (``configs/acceptance_head.yaml``).

Teacher-forced examples: the frozen drafter is unrolled as it drafts from every anchor of the
generated sequences (EAGLE: ``steps`` draft steps; a draft LM: its prediction at every position).
Each drafted step is one example: the hidden state and logits it was drawn from, and the label
"the target accepts it" under the verification the head is trained for:

- greedy (``temperature`` 0): 1 if the drafter's argmax is the target's argmax, else 0;
- sampling (``temperature`` > 0): the soft label sum_v min(p, q), the probability that a token
  drawn from q is kept by lossless speculative sampling (not a sampled 0/1 label).

An example at draft step j counts with weight prod_{i<j} (label of step i): the head estimates
acceptance *given the earlier tokens were accepted*, which is what the stopping rule multiplies.
The loss is binary cross-entropy with rejections up-weighted by ``reject_weight`` (SpecDec++).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc

from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.acceptance_head.network import HEADED, AcceptanceHead, AcceptanceHeadConfig, weights_hash
from draftsmith.families.registry import load_network
from draftsmith.layers.causal_lm import DraftLMNetwork
from draftsmith.layers.estimate import acceptance_prob, choice, choice_ahead
from draftsmith.layers.module import DrafterModule, OptimConfig, shift


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, reject_weight: float) -> torch.Tensor:
    """-(y log s(z) + w (1 - y) log(1 - s(z))) per example: (...) logits and (soft) labels -> (...)."""
    return -(labels * F.logsigmoid(logits) + reject_weight * (1 - labels) * F.logsigmoid(-logits))


class AcceptanceHeadModule(DrafterModule):
    """Trains an ``AcceptanceHead`` on a frozen trained drafter against the frozen target.

    Args:
        target: local HF model directory of the target.
        drafter: the trained drafter to head: a ``draftsmith fit`` ``.ckpt`` or a native dir (EAGLE-1,
            EAGLE-3 or draft LM).
        steps: draft steps unrolled per anchor (EAGLE; use the largest K you will draft).
        reject_weight: BCE weight of rejected examples (accepted ones weigh 1).
        inner_size: width of the head's MLP.
        layers: hidden layers of the head's MLP.
        threshold: default stopping threshold recorded with the head.
        temperature: verification the head is for: 0 greedy labels, > 0 soft labels at that temperature.
        optim: optimizer and schedule.
    """

    def __init__(
        self,
        target: str,
        drafter: str,
        steps: int = 6,
        reject_weight: float = 3.0,
        inner_size: int = 256,
        layers: int = 2,
        threshold: float = 0.5,
        temperature: float = 0.0,
        optim: OptimConfig | None = None,
    ) -> None:
        if steps <= 0 or reject_weight <= 0 or layers <= 0 or inner_size <= 0:
            raise DraftsmithError(
                f"acceptance head: steps, reject_weight, layers and inner_size must be positive, got "
                f"{steps}, {reject_weight}, {layers}, {inner_size}"
            )
        if not Path(drafter).exists():
            raise DraftsmithError(f"acceptance head: drafter {drafter!r} does not exist (a .ckpt or native dir)")
        network, info = load_network(drafter)
        if info["method"] not in HEADED:
            raise DraftsmithError(
                f"acceptance head: drafter {drafter!r} is a {info['method']} drafter; heads need one of {HEADED}"
            )
        self._base = (network.for_export(), info, drafter)
        self.head_args = {"inner_size": inner_size, "layers": layers, "threshold": threshold}
        self.steps, self.reject_weight, self.sampling = steps, reject_weight, Sampling(temperature)
        super().__init__(target, optim, None)
        check_fingerprint(info["target"], self.target.fingerprint, f"drafter {drafter!r}")
        self.save_hyperparameters()

    def feature_layers_for(self, target_path: str) -> tuple[int, ...]:
        return self._base[0].reads_layers

    def build_drafter(self) -> AcceptanceHead:
        network, info, _ = self._base
        cfg = AcceptanceHeadConfig(
            drafter_method=network.method,
            drafter_config=asdict(network.cfg),
            drafter_hash=weights_hash(network.as_drafter().model),
            hidden_size=network.output_size,
            temperature=self.sampling.temperature,
            **self.head_args,
        )
        return AcceptanceHead(cfg, network)

    def _label(self, p: torch.Tensor, logits: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
        """Acceptance of the token drawn from draft ``logits`` (B,T,Vd) against the target's ``choice`` p -> (B,T)."""
        return acceptance_prob(p, choice(logits, self.sampling), self.sampling.greedy, draft_ids)

    @torch.no_grad()
    def _drafted(self, batch: dict, out: TargetOutput):
        """Per draft step: (hidden (B,T,H), drafter logits (B,T,Vd), acceptance label (B,T), mask (B,T))."""
        base, ids = self.drafter.base, batch["input_ids"]
        p = choice(out.logits, self.sampling)  # row t predicts x_{t+1}
        if isinstance(base, DraftLMNetwork):
            res = base.model(input_ids=ids, attention_mask=batch["attention_mask"], output_hidden_states=True)
            logits = res.logits.float()
            label = self._label(p, logits, torch.arange(logits.shape[-1], device=ids.device))
            yield res.hidden_states[-1], logits, label, shift(batch["loss_mask"], 1).bool()
            return
        draft_ids = base.draft_ids
        for j, hidden in enumerate(base(ids, out.features, self.steps, batch["attention_mask"])):
            logits = base.logits(hidden).float()  # anchor i at step j predicts x_{i+j+2}: target row i+j+1
            yield (
                hidden,
                logits,
                self._label(choice_ahead(p, j + 1), logits, draft_ids),
                shift(batch["loss_mask"], j + 2).bool(),
            )

    def examples(self, batch: dict, out: TargetOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N,) head logits, acceptance labels and weights (P(earlier steps accepted)) of every drafted step."""
        logits, labels, weights = [], [], []
        prior = None
        for hidden, draft_logits, label, mask in self._drafted(batch, out):
            prior = torch.ones_like(label) if prior is None else prior
            logits.append(self.drafter(hidden, draft_logits)[mask])
            labels.append(label[mask])
            weights.append(prior[mask])
            prior = prior * label
        return torch.cat(logits), torch.cat(labels), torch.cat(weights)

    def losses(self, batch: dict, out: TargetOutput) -> dict[str, torch.Tensor]:
        z, y, w = self.examples(batch, out)
        loss = (weighted_bce(z, y, self.reject_weight) * w).sum() / w.sum().clamp_min(1e-6)
        return {"loss": loss, "accept_rate": (y * w).sum() / w.sum().clamp_min(1e-6)}

    # validation: loss and AUROC of the head on held-out data (replaces the base's τ estimate)
    def on_validation_epoch_start(self) -> None:
        self._val: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._val.append(tuple(t.detach().cpu() for t in self.examples(batch, self.target_forward(batch))))

    def on_validation_epoch_end(self) -> None:
        metrics = validation_metrics(self._val, self.reject_weight)
        if metrics:
            self.log_dict({f"val/{k}": v for k, v in metrics.items()}, prog_bar=True)


def validation_metrics(parts: list[tuple[torch.Tensor, ...]], reject_weight: float) -> dict[str, float]:
    """Loss, AUROC and acceptance rate over examples whose earlier steps were accepted (weight > 0.5).

    Soft labels are drawn as 0/1 acceptance events (fixed seed) for the AUROC.
    """
    z, y, w = (torch.cat(t) for t in zip(*parts, strict=True)) if parts else (torch.empty(0),) * 3
    keep = w > 0.5
    z, y = z[keep], y[keep]
    if len(z) == 0:
        return {}
    events = y if bool(((y == 0) | (y == 1)).all()) else torch.bernoulli(y, generator=torch.Generator().manual_seed(0))
    auroc = float(binary_auroc(torch.sigmoid(z), events.long())) if 0 < events.sum() < len(events) else 0.5
    return {"loss": float(weighted_bce(z, y, reject_weight).mean()), "auroc": auroc, "accept_rate": float(y.mean())}
