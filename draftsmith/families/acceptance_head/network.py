"""SpecDec++ acceptance-prediction head and adaptive draft length (Huang et al. 2024, arXiv:2405.19715).

A small MLP reads the hidden state a frozen drafter drafted each token from (plus that
distribution's top probability and entropy) and predicts the probability that the target will
accept the token, given that the tokens before it were accepted. ``AdaptiveDrafter`` drafts a
chain and stops as soon as the predicted probability that *some* token so far is rejected,
1 - prod_i a_i, exceeds a threshold: drafts get long where the text is easy and short where it
is not. The verifier is unchanged (it takes drafts shorter than k), so greedy output stays
exactly plain greedy decoding and sampling stays lossless.

The head's network holds a frozen copy of the drafter it was trained on (its ``method``, config
and weights), so one checkpoint or native dir is a complete drafter; it also records a hash of
those weights, so a head is never silently paired with another drafter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.core.draft import Draft, Drafter, DrafterNetwork
from draftsmith.core.hf_cache import cache_arg
from draftsmith.core.sampling import Sampling, probs, sample
from draftsmith.core.target import TargetOutput
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import build_network, load_network, register
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.layers.tree_draft import TreeDrafter

HEADED = ("eagle1", "eagle3", "draft_lm")
"""Drafter methods a head can be trained on: those whose drafting exposes the hidden state per token."""


@dataclass
class AcceptanceHeadConfig:
    """Shape of an acceptance head and the identity of the drafter it heads."""

    drafter_method: str = ""
    """``method`` of the frozen drafter network (one of ``HEADED``)."""
    drafter_config: dict = field(default_factory=dict)
    """That network's config dataclass, as a dict."""
    drafter_hash: str = ""
    """``weights_hash`` of that network."""
    hidden_size: int = 0
    """Size of the drafter's hidden state."""
    inner_size: int = 256
    """Width of the MLP."""
    layers: int = 2
    """Hidden layers of the MLP."""
    threshold: float = 0.5
    """Default stopping threshold on P(some drafted token is rejected)."""
    temperature: float = 0.0
    """The verification it was trained for: 0 greedy (label: argmax match), > 0 soft label sum(min(p, q))."""


def weights_hash(model: nn.Module) -> str:
    """A short hash of a network's parameter and buffer values (names included)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_threshold(threshold: float) -> float:
    if not 0.0 <= threshold <= 1.0:
        raise DraftsmithError(
            f"adaptive threshold must be in [0, 1] (a probability that some drafted token is rejected), got {threshold}"
        )
    return float(threshold)


def _build_drafter_network(method: str, config: dict) -> nn.Module:
    if method not in HEADED:
        raise DraftsmithError(
            f"an acceptance head needs a drafter that exposes its hidden states ({', '.join(HEADED)}), got {method!r}"
        )
    return build_network(method, config)


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) drafter logits -> (..., 2): top probability and entropy of the drafter's distribution."""
    p = torch.softmax(logits.float(), -1)
    return torch.stack([p.max(-1).values, torch.special.entr(p).sum(-1)], dim=-1)


@register("acceptance_head", config=AcceptanceHeadConfig)
class AcceptanceHead(DrafterNetwork):
    """The head (an MLP on the normed hidden state and two confidence features) and its frozen drafter.

    Args:
        cfg: the head's shape and its drafter's method and config.
        drafter: the drafter network to head (default: built from ``cfg``, weights loaded later).
    """

    method = "acceptance_head"

    def __init__(self, cfg: AcceptanceHeadConfig, drafter: nn.Module | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        base = drafter if drafter is not None else _build_drafter_network(cfg.drafter_method, cfg.drafter_config)
        self.base = base.eval().requires_grad_(False)
        self.norm = nn.LayerNorm(cfg.hidden_size)
        dims = [cfg.hidden_size + 2] + [cfg.inner_size] * cfg.layers
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(a, b), nn.SiLU()]
        self.mlp = nn.Sequential(*layers, nn.Linear(dims[-1], 1))

    def train(self, mode: bool = True) -> AcceptanceHead:
        super().train(mode)
        self.base.eval()  # the drafter stays frozen, dropout and all
        return self

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """(..., H) hidden states and (..., V) the drafter's logits drawn from them -> (...) acceptance logits."""
        x = torch.cat([self.norm(hidden.float()), confidence(logits)], dim=-1)
        return self.mlp(x).squeeze(-1)

    def as_drafter(self, topk_accuracy: list | None = None, threshold: float | None = None) -> AdaptiveDrafter:
        """Its drafter with adaptive draft length (``topk_accuracy`` is unused: adaptive drafts are chains)."""
        return AdaptiveDrafter(self.base.as_drafter(), self, self.cfg.threshold if threshold is None else threshold)


def load_adaptive(path: str, target, threshold: float | None = None) -> AdaptiveDrafter:
    """The adaptive drafter of a trained head (``.ckpt`` or native dir), checked against ``target``."""
    if not Path(path).exists():
        raise DraftsmithError(f"acceptance head {path!r} does not exist (a .ckpt or native dir)")
    network, info = load_network(path, target)
    if not isinstance(network, AcceptanceHead):
        raise DraftsmithError(f"{path!r} is a {info['method']} drafter, not an acceptance head")
    return network.as_drafter(threshold=threshold)


class _Stepper:
    """Drafts a chain one token at a time, exposing the hidden state each token was drawn from."""

    def __init__(self, drafter: Drafter, state: Any) -> None:
        self.drafter, self.state = drafter, state

    def first(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(H,) hidden and (V,) logits of the first drafted token."""
        raise NotImplementedError

    def next(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The same for the token after the chain ``tokens`` drafted so far."""
        raise NotImplementedError


class _EagleStepper(_Stepper):
    """EAGLE drafters (``root``/``grow``, ``hidden_in_scratch``): node n's output hidden state is its child's input."""

    def first(self):
        self.scratch, logits = self.drafter.root(self.state)
        return self.scratch.hidden[-1][0, 0], logits

    def next(self, tokens):
        i = len(tokens) - 1
        logits = self.drafter.grow(self.state, self.scratch, tokens, list(range(-1, i)), [i])[0]
        return self.scratch.hidden[i][0, 0], logits


class _DraftLMStepper(_Stepper):
    """Draft LMs: the final (normed) hidden state of the last position, with the drafter's KV cache."""

    def _run(self, new: list[int]):
        model, state = self.drafter.model, self.state
        ids = torch.tensor([new], device=model.device)
        out = model(input_ids=ids, **cache_arg(model, state.cache), use_cache=True, output_hidden_states=True)
        state.cached.extend(new)
        return out.hidden_states[-1][0, -1], out.logits[0, -1].float()

    def first(self):
        return self._run(self.state.ids[len(self.state.cached) :])

    def next(self, tokens):
        return self._run(tokens[-1:])


def _stepper(drafter: Drafter) -> type[_Stepper]:
    if isinstance(drafter, DraftLM):
        return _DraftLMStepper
    if isinstance(drafter, TreeDrafter) and drafter.hidden_in_scratch:
        return _EagleStepper
    raise DraftsmithError(
        f"adaptive drafting needs an EAGLE or draft-LM drafter (one exposing its hidden states), "
        f"got {type(drafter).__name__}"
    )


class AdaptiveDrafter(Drafter):
    """Chain drafting that stops once P(some drafted token is rejected) > ``threshold`` (SpecDec++).

    The token that crosses the threshold is kept (a draft has at least one token); ``k`` stays the
    longest draft. ``threshold`` 1 never stops early (plain K-token drafting); 0 stops at the first
    token the head is not certain of.

    Args:
        base: the drafter ``head`` was trained on (checked by weights hash).
        head: the trained acceptance head.
        threshold: in [0, 1].
    """

    adaptive = True

    def __init__(self, base: Drafter, head: AcceptanceHead, threshold: float) -> None:
        self.threshold = check_threshold(threshold)
        self.stepper = _stepper(base)
        model = getattr(base, "model", None)
        found = weights_hash(model) if isinstance(model, nn.Module) else None
        if found != head.cfg.drafter_hash:
            raise DraftsmithError(
                f"acceptance head was trained on a {head.cfg.drafter_method} drafter with weights hash "
                f"{head.cfg.drafter_hash}, not on this {type(base).__name__} (hash {found}): train a head for it"
            )
        self.base, self.head = base, head.eval()
        for name in ("vocab_size", "tokenizer_hash", "needs_features", "feature_layers"):
            setattr(self, name, getattr(base, name))

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> Any:
        return self.base.begin(tokens, target_out)

    def advance(self, state: Any, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        self.base.advance(state, tokens, target_out)

    @torch.no_grad()
    def propose(self, state: Any, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        if k <= 0:
            return Draft.empty()
        steps = self.stepper(self.base, state)
        hidden, logits = steps.first()
        tokens, qs, all_accepted = [], [], 1.0
        while True:
            q = probs(logits, sampling)
            tokens.append(int(q.argmax()) if sampling.greedy else sample(q, generator))
            qs.append(q)
            all_accepted *= float(torch.sigmoid(self.head(hidden, logits)))
            if len(tokens) == k or 1.0 - all_accepted > self.threshold:
                return Draft.chain(tokens, torch.stack(qs))
            hidden, logits = steps.next(tokens)
