"""The drafter protocol the verifier speaks: ``begin / propose / advance``.

Position convention (shared by every drafter): the verifier hands a drafter
committed tokens together with the target's output at the positions that
*predicted* them. In ``begin(tokens, target_out)``, ``target_out`` row ``i``
predicted ``tokens[i + 1]`` (so it has one row fewer than ``tokens``); in
``advance(state, tokens, target_out)`` row ``i`` predicted ``tokens[i]``.
Feature-based drafters (EAGLE, Medusa, Hydra) read ``target_out.features``;
token-based ones (draft LMs, n-gram) ignore it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput


@dataclass
class Draft:
    """Drafted tokens as a tree; a chain is the width-1 case.

    Attributes:
        tokens: (N,) token of each node, in topological order (parents first).
        parents: (N,) index of each node's parent; -1 means the root, i.e. the
            last committed token.
        q: (N, V) the drafter's distribution each node's token was drawn from
            (siblings drawn from the same distribution share a row), or None
            when the drafter is deterministic (a point mass on the token).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> Draft:
        n = len(tokens)
        return cls(torch.tensor(tokens, dtype=torch.long), torch.arange(-1, n - 1), q)

    @classmethod
    def empty(cls) -> Draft:
        return cls.chain([])

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(-1, len(self) - 1)).all())


@dataclass
class DecodeResult:
    """One prompt's decoding.

    Attributes:
        tokens: the generated tokens (prompt excluded).
        accepted: per verification round, how many draft tokens were accepted.
        drafted: per verification round, how many tokens were drafted (tree nodes for trees; duplicates once).
        depth: per verification round, the draft's depth (its length for chains).
        target_calls: target forwards, prefill included.
        seconds: wall-clock time of the whole decode.
        draft_seconds: of which spent in the drafter (propose + advance).
        judged: per verification round, how many of the accepted tokens only a judge kept (Judge decoding; empty
            for lossless rules).
    """

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    target_calls: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0
    judged: list[int] = field(default_factory=list)


class Drafter(ABC):
    """A model that proposes tokens for the target to verify.

    Attributes:
        vocab_size: size of the token space of the drafter's distributions q
            (must equal the target's), or None for drafters without one (n-gram).
        tokenizer_hash: hash of the drafter's tokenizer when it has one, checked
            against the target's.
        needs_features: whether the drafter reads ``target_out.features`` (the
            verifier skips computing them otherwise).
        feature_layers: the target ``hidden_states`` indices the drafter reads, in
            order (None: the target's own ``feature_layers``).
        own_target: the target this drafter was trained with when it fine-tuned it (Medusa-2);
            the verifier then decodes, and measures plain decoding, with that one.
        adaptive: it drafts fewer than ``k`` tokens where it predicts rejections (``k`` is its cap: SpecDec++'s
            acceptance head, DSpark's confidence head); ``score --k auto`` then measures its acceptance as it
            drafts (calibration) rather than from validation accuracies of full-length drafts.
    """

    vocab_size: int | None = None
    tokenizer_hash: str | None = None
    needs_features: bool = False
    feature_layers: tuple[int, ...] | None = None
    own_target: Any = None
    adaptive: bool = False

    @abstractmethod
    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> Any:
        """Start on a new sequence: (T,) tokens, target rows predicting tokens[1:]. Returns the state."""

    @abstractmethod
    def propose(self, state: Any, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        """Propose up to ``k`` tokens after the committed ones (a chain of depth <= k)."""

    def bind(self, target: Any) -> None:  # noqa: B027 (optional: most drafters need nothing of the target)
        """Called by the verifier with the target it verifies for, before ``begin`` (a self-drafter runs its
        layers); by default nothing."""

    def compile(self) -> None:  # noqa: B027 (optional: most drafters have nothing worth compiling)
        """Compile the drafter's forward (``core.target.compiled_forward``) where that pays; by default nothing."""

    def extra_metrics(self, results: list[DecodeResult]) -> dict:
        """What this drafter adds to its score row, given its decodes of the scored prompts (online adaptation:
        α and τ over time)."""
        return {}

    @abstractmethod
    def advance(self, state: Any, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        """Commit (n,) verified tokens; ``target_out`` row i predicted tokens[i]."""


class DrafterNetwork(torch.nn.Module):
    """The trainable network of a drafter family: what a native dir stores and the verifier's drafter wraps.

    Attributes:
        method: the family's registered name for this network (a property where the config picks it).
        cfg: its config dataclass (recorded as JSON beside the weights).
    """

    method: str
    cfg: Any

    def as_drafter(self, topk_accuracy: list | None = None) -> Drafter:
        """The verifier's drafter over this network (``topk_accuracy``: what static trees are built from)."""
        raise NotImplementedError

    @property
    def reads_layers(self) -> tuple[int, ...]:
        """The target hidden_states indices the network reads (a draft LM reads none: the final one by default)."""
        return (-1,)

    @property
    def output_size(self) -> int:
        """Width of the hidden state it drafts from (what an acceptance head reads)."""
        raise NotImplementedError

    def for_export(self) -> DrafterNetwork:
        """The network whose weights an export writes (a LoRA-trained draft LM merges its adapter)."""
        return self

    def adapted_target(self, target: Any) -> Any:
        """The target this drafter drafts for when it fine-tuned it (Medusa-2), else None."""
        return None
