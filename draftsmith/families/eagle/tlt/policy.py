"""TLT's target being trained: a LoRA adapter (peft) on the target, updated by SFT or GRPO each step.

The adapter is injected into ``target.model`` in place (as Medusa-2 does), so the ``Target`` the verifier decodes with
is the policy being trained: every rollout is decoded with the current weights. Updates:

- ``sft``: cross-entropy on the task's worked solutions (then EOS) of the step's problems.
- ``grpo``: GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300) on the step's sampled rollouts: each problem's
  ``group`` rollouts get advantages (r - mean) / (std + eps) of their rewards within the group; the loss is
  -A times the mean log-probability of the rollout's tokens under the sampling distribution (logits / temperature),
  averaged over rollouts. One gradient step per batch of rollouts, so the policy ratio is 1 and PPO's clipping never
  binds; no KL penalty (beta = 0). ``sft_steps`` SFT steps first teach the solution format the reward checks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import PreTrainedModel

from draftsmith.core.numerics import make_batch_invariant
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.layers.lora import Lora

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""A Llama-style block's linear layers: TLT's default adapter covers all of them (the target must move)."""


@dataclass(frozen=True)
class PolicyConfig:
    """How the target is trained."""

    update: Literal["sft", "grpo"] = "sft"
    """``sft`` on the worked solutions, or ``grpo`` on the rollouts' rewards (rollout temperature > 0)."""
    sft_steps: int = 0
    """With ``grpo``: SFT steps before the GRPO ones."""
    lr: float = 2e-3
    """AdamW learning rate of the adapter."""
    lora: Lora = field(default_factory=lambda: Lora(r=8, alpha=16, target_modules=ALL_LINEAR))
    """The adapter (rank, scale, which linear layers)."""
    group: int = 4
    """GRPO: rollouts per problem (their rewards are compared within the group)."""

    def __post_init__(self) -> None:
        if self.update not in ("sft", "grpo"):
            raise DraftsmithError(f"policy.update must be sft or grpo, got {self.update!r}")
        if self.lr <= 0 or self.sft_steps < 0 or self.group < 1:
            raise DraftsmithError("policy: lr must be positive, sft_steps >= 0 and group >= 1")
        if self.update == "grpo" and self.group < 2:
            raise DraftsmithError("policy.group must be at least 2 for grpo (advantages compare rollouts in a group)")

    def rule(self, step: int) -> str:
        """The update of training step ``step``: ``sft`` or ``grpo``."""
        return "sft" if self.update == "sft" or step < self.sft_steps else "grpo"


class Policy:
    """The LoRA adapter on ``target.model`` and its optimizer.

    Args:
        target: the target; its model gets the adapter in place (its other weights stay frozen).
        cfg: the update rule and adapter.
    """

    def __init__(self, target: Target, cfg: PolicyConfig) -> None:
        from peft import LoraConfig, get_peft_model

        self.target, self.cfg = target, cfg
        try:
            self.peft = get_peft_model(target.model, LoraConfig(**cfg.lora.peft_kwargs()))
        except ValueError as e:  # peft: "Target modules {...} not found in the base model"
            raise DraftsmithError(f"policy.lora.target_modules: {str(e).splitlines()[0]}") from None
        if target.batch_invariant:  # the adapter's own Linears too, or bf16 rollouts leave plain greedy decoding
            make_batch_invariant(target.model)
        target.model.eval()  # no dropout: the rollouts and the updates see one function
        self.params = [p for p in self.peft.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)

    def _logprobs(self, rows: list[tuple[list[int], list[int]]], temperature: float) -> list[torch.Tensor]:
        """Per (prompt, completion) row, the completion tokens' log-probabilities (n,) under the model, with grad."""
        lengths = [len(p) + len(c) for p, c in rows]
        ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, : lengths[i]] = torch.tensor(p + c)
        mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
        device = self.target.device
        logits = self.target.model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float() / temperature, -1)  # (B, T-1, V); row t predicts t+1
        token = logp.gather(-1, ids[:, 1:, None].to(device))[..., 0]  # (B, T-1)
        return [token[i, len(p) - 1 : len(p) - 1 + len(c)] for i, (p, c) in enumerate(rows)]

    def _step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def sft(self, rows: list[tuple[list[int], list[int]]]) -> dict:
        """One step of cross-entropy on (prompt, solution + EOS) rows, the solution's tokens only."""
        with torch.enable_grad():
            token = torch.cat(self._logprobs(rows, 1.0))
            loss = -token.mean()
            self._step(loss)
        return {"rule": "sft", "loss": float(loss.detach())}

    def grpo(self, rows: list[tuple[list[int], list[int]]], rewards: list[float], temperature: float) -> dict:
        """One GRPO step on rollouts (prompt, completion) of consecutive groups of ``cfg.group`` per problem."""
        g = self.cfg.group
        r = torch.tensor(rewards, dtype=torch.float).view(-1, g)  # (problems, group)
        advantages = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).flatten()
        if not advantages.abs().sum():  # every group's rewards are equal: no signal, no step
            return {"rule": "grpo", "loss": 0.0, "skipped": True}
        with torch.enable_grad():
            seq = [t.mean() if len(t) else t.sum() for t in self._logprobs(rows, temperature)]
            loss = -(advantages.to(self.target.device) * torch.stack(seq)).mean()
            self._step(loss)
        return {"rule": "grpo", "loss": float(loss.detach()), "skipped": False}

    def merged(self) -> PreTrainedModel:
        """A copy of the target with the adapter merged into its weights (what is saved at the end)."""
        return copy.deepcopy(self.peft).merge_and_unload()
