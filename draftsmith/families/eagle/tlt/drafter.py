"""TLT's adaptive drafter: an EAGLE layer trained on the rollouts' own tokens and target features.

TLT (Hu et al. 2025, "Taming the Long-Tail: Efficient Reasoning RL Training with Adaptive Drafter",
arXiv:2511.16665; code: github.com/mit-han-lab/fastrl) keeps a single-layer EAGLE drafter aligned with a target that
RL changes every step: the target's hidden states are captured while the rollouts are decoded (the verification
forwards compute them anyway: no extra target forward), kept in a buffer across steps, and the drafter takes a few
gradient steps on them between RL steps, on compute the long-tail rollouts leave idle; the drafter serves the next
step's rollouts. Here:

- ``Recorder`` wraps the drafter the verifier decodes a rollout with and keeps what the verifier hands it: every
  committed token and the target's features at the positions that predicted them, plus the target's final hidden
  state (its logits are the LM head on it, recomputed at training time instead of stored).
- ``AdaptiveDrafter`` holds the EAGLE network, a buffer of the latest rollouts (TLT's DataBuffer) and its optimizer;
  ``update`` takes ``steps`` AdamW steps of EAGLE's own losses (``families.eagle.module.eagle_losses``) on random
  minibatches of the buffer. On 2 CPU cores nothing is idle, so the loop runs it between steps and times it apart.

The drafter changes only between rollouts, never inside one: greedy rollouts stay plain greedy decoding of the
current target and sampled ones stay distributed as the target's (the verifier's guarantees).
"""

from __future__ import annotations

import copy
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.module import eagle_losses
from draftsmith.families.eagle.network import EagleModel
from draftsmith.layers.features import default_feature_layers


@dataclass(frozen=True)
class DrafterConfig:
    """The adaptive drafter and how it learns."""

    version: int = 1
    """EAGLE version: 1 (reads the final hidden state, drafts through the target's head: TLT's single layer) or 3."""
    init: str | None = None
    """An EAGLE drafter for this target to start from (native dir or checkpoint); None: a fresh one, trained on the
    warm-up steps' rollouts."""
    lr: float = 3e-3
    """AdamW learning rate."""
    steps: int = 8
    """Gradient steps per training step."""
    batch_size: int = 8
    """Rollouts per gradient step."""
    buffer: int = 64
    """Latest rollouts kept for training (across training steps)."""
    ttt_steps: int = 3
    """EAGLE-3's training-time-test steps (EAGLE-1 trains with 1)."""
    seed: int = 0
    """Seed of the minibatch draws."""

    def __post_init__(self) -> None:
        if self.version not in (1, 3):
            raise DraftsmithError(f"drafter.version must be 1 or 3, got {self.version}")
        for name in ("steps", "batch_size", "buffer", "ttt_steps"):
            if getattr(self, name) < (0 if name == "steps" else 1):
                raise DraftsmithError(f"drafter.{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise DraftsmithError(f"drafter.lr must be positive, got {self.lr}")
        if self.init is not None and not Path(self.init).exists():  # checked before the target is loaded
            raise DraftsmithError(f"drafter.init: {self.init} does not exist")


@dataclass
class Rollout:
    """One decoded rollout as the drafter trains on it."""

    ids: list[int]
    """Prompt and completion tokens."""
    prompt_len: int
    features: tuple[torch.Tensor, ...]
    """Per drafter feature layer, (len(ids) - 1, H): row i is the target's state at position i (it predicted ids[i+1])."""
    final: torch.Tensor
    """(len(ids) - 1, H) the target's final (normed) hidden state at the same positions: its logits are the head on it."""


@dataclass
class _Open:
    ids: list[int]
    rows: list[tuple[torch.Tensor, ...]] = field(default_factory=list)


class Recorder(Drafter):
    """Decodes with ``inner`` and records every rollout's tokens and the target's features for them.

    Args:
        inner: the drafter the verifier decodes with (a feature drafter or any other).
        final_layer: the target's final hidden-state index (``Target.num_layers``), recorded beside ``inner``'s layers.
    """

    needs_features = True

    def __init__(self, inner: Drafter, final_layer: int) -> None:
        self.inner = inner
        own = tuple(inner.feature_layers or ()) if inner.needs_features else ()
        self.feature_layers = own if final_layer in own else (*own, final_layer)
        self._own, self._final = len(own), self.feature_layers.index(final_layer)
        self.vocab_size, self.tokenizer_hash = inner.vocab_size, inner.tokenizer_hash
        self.last: _Open | None = None

    def bind(self, target: Any) -> None:
        self.inner.bind(target)

    def _keep(self, out: TargetOutput) -> None:
        self.last.rows.append(tuple(f.detach().cpu() for f in out.features))

    def _inner(self, out: TargetOutput) -> TargetOutput:
        return TargetOutput(out.logits, out.features[: self._own], out.past_key_values)

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> Any:
        self.last = _Open(tokens.tolist())
        self._keep(target_out)
        return self.inner.begin(tokens, self._inner(target_out))

    def propose(self, state: Any, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        return self.inner.propose(state, k, sampling, generator)

    def advance(self, state: Any, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        self.last.ids.extend(tokens.tolist())
        self._keep(target_out)
        self.inner.advance(state, tokens, self._inner(target_out))

    def take(self, prompt_len: int, length: int) -> Rollout:
        """The last decode's rollout, cut to its first ``length`` tokens (the verifier may commit tokens after EOS)."""
        rec, self.last = self.last, None
        layers = [torch.cat([row[i] for row in rec.rows])[: length - 1] for i in range(len(self.feature_layers))]
        return Rollout(rec.ids[:length], prompt_len, tuple(layers[: self._own]), layers[self._final])


def resolved(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """Hidden-state indices with negative ones counted from the end (-1 = the final state)."""
    return tuple(layer + num_layers + 1 if layer < 0 else layer for layer in layers)


class AdaptiveDrafter:
    """An EAGLE network trained online on rollouts.

    Args:
        target: the target it drafts for (its embedding and head start a fresh network).
        cfg: the drafter and its training.
    """

    def __init__(self, target: Target, cfg: DrafterConfig) -> None:
        self.cfg = cfg
        if cfg.init is not None:
            from draftsmith.families.registry import load_network

            network, info = load_network(cfg.init, target)
            if info["method"] not in ("eagle1", "eagle3"):
                raise DraftsmithError(f"drafter.init: {cfg.init} holds a {info['method']} drafter, not an EAGLE one")
        else:
            layers = resolved(default_feature_layers(target.num_layers, cfg.version), target.num_layers)
            network = EagleModel(EagleConfig.from_target(target.config, cfg.version, layers))
            network.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
        target.check_final_logits("TLT's adaptive drafter")
        self.network = network.to(target.device).eval()
        params = [p for p in self.network.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        self.buffer: deque[Rollout] = deque(maxlen=cfg.buffer)
        self.rng = random.Random(cfg.seed)
        self.ttt_steps = cfg.ttt_steps if self.network.cfg.version == 3 else 1
        self.updates = 0

    def recorder(self, target: Target) -> Recorder:
        """The drafter that decodes the rollouts and records them (``take`` each one, then ``add`` them)."""
        return Recorder(self.network.as_drafter(), target.num_layers)

    def frozen(self) -> Drafter:
        """A copy of the drafter as it is now, never trained again (the baseline TLT is measured against)."""
        return copy.deepcopy(self.network).as_drafter()

    def add(self, rollouts: list[Rollout]) -> None:
        self.buffer.extend(r for r in rollouts if len(r.ids) > r.prompt_len + 1)

    def batch(self, rollouts: list[Rollout], target: Target) -> tuple[dict, TargetOutput]:
        """Rollouts as EAGLE's training batch and the target's output over it, right-padded to the longest."""
        device, t = target.device, max(len(r.ids) for r in rollouts)
        ids = torch.zeros(len(rollouts), t, dtype=torch.long)
        valid = torch.zeros(len(rollouts), t, dtype=torch.long)
        loss_mask = torch.zeros(len(rollouts), t, dtype=torch.long)
        for i, r in enumerate(rollouts):
            ids[i, : len(r.ids)] = torch.tensor(r.ids)
            valid[i, : len(r.ids)] = 1
            loss_mask[i, r.prompt_len : len(r.ids)] = 1  # generated tokens: what a draft is checked against

        def pad(rows: list[torch.Tensor]) -> torch.Tensor:  # (n_i, H) each -> (B, T, H); row T-1 never read
            return torch.stack([F.pad(x, (0, 0, 0, t - len(x))) for x in rows]).to(device)

        features = tuple(pad([r.features[j] for r in rollouts]) for j in range(len(rollouts[0].features)))
        with torch.no_grad():
            logits = target.final_logits(pad([r.final for r in rollouts]))  # (B, T, V)
        batch = {"input_ids": ids.to(device), "attention_mask": valid.to(device), "loss_mask": loss_mask.to(device)}
        return batch, TargetOutput(logits, features)

    def update(self, target: Target) -> dict:
        """``cfg.steps`` gradient steps on minibatches of the buffer: the loss of the first and the last, and time."""
        start, losses = time.perf_counter(), []
        if not self.buffer or not self.cfg.steps:
            return {"steps": 0, "seconds": 0.0}
        self.network.train()
        with torch.enable_grad():
            for _ in range(self.cfg.steps):
                chosen = self.rng.sample(list(self.buffer), min(self.cfg.batch_size, len(self.buffer)))
                loss = eagle_losses(self.network, *self.batch(chosen, target), self.ttt_steps)["loss"]
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.network.parameters(), 1.0)
                self.optimizer.step()
                losses.append(float(loss.detach()))
        self.network.eval()
        self.updates += 1
        seconds = time.perf_counter() - start
        return {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1], "seconds": seconds}
