"""Online speculative decoding (OSD; Liu et al. 2023, arXiv:2310.07177): the drafter learns while it serves.

``OnlineDrafter`` wraps a draft LM. In every verification round that rejects a drafted token,
``advance`` receives the target's output at the committed positions; its row n (n = tokens
accepted) is the target's distribution at the first rejected position, already computed by
the verifier. The wrapper keeps (context, target distribution) for the latest ``buffer_size``
such positions and, every ``update_every`` new ones, takes ``steps`` AdamW steps on minibatches
of the buffer minimising KL(p_target || q_draft) there. Only the drafter changes, so greedy
output stays plain greedy decoding and sampling stays lossless; the time spent learning counts
as drafter time in the speed figures.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import torch

from draftsmith.core.draft import DecodeResult, Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target, TargetOutput, new_cache
from draftsmith.decode.metrics import prompt_windows
from draftsmith.errors import DraftsmithError
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.layers.losses import soft_cross_entropy


@dataclass(frozen=True)
class OnlineConfig:
    """How ``OnlineDrafter`` learns, and how its report slices time."""

    lr: float = 3e-4
    """AdamW learning rate."""
    buffer_size: int = 256
    """Rejected positions kept (the latest)."""
    update_every: int = 16
    """New rejected positions between updates."""
    steps: int = 4
    """Gradient steps per update."""
    batch_size: int = 16
    """Buffered positions per gradient step."""
    max_context: int = 256
    """Context tokens kept before each buffered position (the latest)."""
    windows: int = 4
    """Windows of consecutive prompts the report gives α and τ for."""
    seed: int = 0
    """Seed of the minibatch draws."""

    def __post_init__(self) -> None:
        for name in ("buffer_size", "update_every", "steps", "batch_size", "max_context", "windows"):
            if getattr(self, name) <= 0:
                raise DraftsmithError(f"online adaptation: {name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0:
            raise DraftsmithError(f"online adaptation: lr must be positive, got {self.lr}")


class OnlineDrafter(Drafter):
    """A draft LM that distils the target on the positions where its drafts were rejected (OSD).

    Args:
        base: the draft LM (its weights are updated in place).
        target: the target it drafts for (refused if the draft LM *is* the target's model).
        cfg: learning settings.
    """

    def __init__(self, base: Drafter, target: Target, cfg: OnlineConfig | None = None) -> None:
        if not isinstance(base, DraftLM):
            raise DraftsmithError(f"--online-adapt trains draft LMs (OSD); this drafter is a {type(base).__name__}")
        if base.model is target.model:
            raise DraftsmithError("--online-adapt would train the target itself (drafter 'target'): use a draft LM")
        self.base, self.cfg = base, cfg or OnlineConfig()
        for name in ("vocab_size", "tokenizer_hash", "needs_features", "feature_layers"):
            setattr(self, name, getattr(base, name))
        base.model.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(base.model.parameters(), lr=self.cfg.lr)
        self.buffer: list[tuple[list[int], torch.Tensor]] = []
        self.rng = random.Random(self.cfg.seed)
        self.pending = self.rejections = self.updates = 0
        self.losses: list[float] = []
        """Mean KL of the first step of each update (before it changes the weights)."""
        self._drafted = 0

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> Any:
        return self.base.begin(tokens, target_out)

    def propose(self, state: Any, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        draft = self.base.propose(state, k, sampling, generator)
        self._drafted = len(draft)
        return draft

    def advance(self, state: Any, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        n = len(tokens) - 1  # draft tokens accepted; tokens[n] is the target's own token
        if n < self._drafted:  # a drafted token was rejected at position n: learn the target's distribution there
            context = (state.ids + tokens[:n].tolist())[-self.cfg.max_context :]
            self.buffer.append((context, torch.softmax(target_out.logits[n].float(), -1).cpu()))
            del self.buffer[: -self.cfg.buffer_size]
            self.rejections += 1
            self.pending += 1
        self._drafted = 0  # the verifier skips propose when nothing is left to draft
        self.base.advance(state, tokens, target_out)
        if self.pending >= self.cfg.update_every:
            self.update()
            # the draft LM's cache holds keys/values of the old weights: recompute the context
            state.cache, state.cached = new_cache(), []

    def update(self) -> None:
        """``steps`` AdamW steps of forward KL to the target on random minibatches of the buffer."""
        model, device = self.base.model, self.base.model.device
        # the verifier decodes in inference mode; learning needs autograd (and tensors made outside that mode)
        with torch.inference_mode(False), torch.enable_grad():
            for step in range(self.cfg.steps):
                batch = self.rng.sample(self.buffer, min(self.cfg.batch_size, len(self.buffer)))
                lengths = torch.tensor([len(c) for c, _ in batch])
                ids = torch.zeros(len(batch), int(lengths.max()), dtype=torch.long)
                for i, (c, _) in enumerate(batch):
                    ids[i, : len(c)] = torch.tensor(c)
                mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
                last = logits[torch.arange(len(batch)), lengths - 1]  # (B, V) at each buffered position
                p = torch.stack([q.clone() for _, q in batch]).to(device)
                loss = soft_cross_entropy(last, p).mean()  # = KL(p || q) + H(p): the same gradient
                if step == 0:
                    self.losses.append(float(loss.detach()) + float(torch.special.entr(p).sum(-1).mean()))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        self.pending = 0
        self.updates += 1

    def extra_metrics(self, results: list[DecodeResult]) -> dict:
        """The score row's ``online`` entry."""
        return {"online": self.online_report(results)}

    def online_report(self, results: list[DecodeResult]) -> dict:
        """α and τ per window of consecutive prompts (first vs last shows the adaptation), and the learning done."""
        return {
            "config": asdict(self.cfg),
            "updates": self.updates,
            "rejections": self.rejections,
            "kl_first_update": self.losses[0] if self.losses else None,
            "kl_last_update": self.losses[-1] if self.losses else None,
            "windows": prompt_windows(results, self.cfg.windows),
        }


def adapt_online(drafters: dict[str, Drafter], target: Target, cfg: OnlineConfig | None = None) -> dict[str, Drafter]:
    """Every drafter wrapped in an ``OnlineDrafter`` (``draftsmith score --online-adapt``)."""
    out = {}
    for name, drafter in drafters.items():
        try:
            out[name] = OnlineDrafter(drafter, target, cfg)
        except DraftsmithError as e:
            raise DraftsmithError(f"drafter {name!r}: {e}") from None
    return out
