"""DSpark (arXiv 2607.05147): DFlash's block drafter plus a Markov head and a confidence head.

The backbone is DFlash's (``families/dflash``): one forward over the committed token and ``depth`` masks gives every
mask's normed output state h_d and base logits ``lm_head(h_d)``. DSpark adds, as speculators 0.9.0
(``models/dspark``), SpecForge 0.2.0 (``modeling/draft/dspark.py``) and vLLM 0.32 (``qwen3_dspark.py``) define them:

- the **Markov head** (``markov_head.markov_w1`` (V, r) embedding, ``markov_head.markov_w2`` (V, r) projection, no
  bias; the peers' "vanilla" head): mask d's logits are ``lm_head(h_d) + w2(w1[prev_d])``, prev_d the token drafted
  just before it (the committed token for the first mask). Drafting samples left to right, each mask's bias from
  the token the one before drew, which is cheap: the backbone ran once.
- the **confidence head** (``confidence_head.proj``, a Linear to one logit with bias) reads ``[h_d, w1[prev_d]]``
  (``confidence_with_markov``; else h_d alone): sigmoid of it is mask d's predicted acceptance probability given the
  earlier ones were accepted, trained (``module.py``) against Σ min(p, q), the analytical acceptance of the
  Markov-corrected q. Its running product over the block (the survival of the draft) sets how much of the block a
  round proposes: the positions whose survival is at least ``threshold`` (at least one).

Layout: DFlash's (the peers' ``sample_from_anchor: false``, vLLM's "fill-in" block): the committed token then the
masks, mask d + 1 predicting x_{a+d+2}; the masks are the target's embedding of ``mask_token_id`` (``mask_from_token``,
as every peer's DSpark embeds them) unless trained otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.core.draft import Draft
from draftsmith.core.sampling import probs, sample
from draftsmith.errors import DraftsmithError
from draftsmith.families.dflash.network import DFlashConfig, DFlashDrafter, DFlashModel, DFlashState
from draftsmith.families.registry import extended, register


@dataclass
class DSparkConfig(DFlashConfig):
    """DFlash's shape plus DSpark's heads; target-derived fields are filled by ``from_target``."""

    markov_rank: int = 256
    """r of the Markov head's low-rank previous-token bias w2(w1[prev]) (speculators' default)."""
    confidence_with_markov: bool = True
    """The confidence head reads the previous token's Markov embedding beside the mask's state."""
    threshold: float = 0.1
    """Default confidence cut: a round proposes the block's positions whose predicted survival (the product of the
    confidences up to them) is at least this (0: the whole block)."""
    mask_from_token: bool = True

    @staticmethod
    def from_target(target_config, feature_layers, depth: int, num_layers: int, **heads) -> DSparkConfig:
        backbone = DFlashConfig.from_target(target_config, feature_layers, depth, num_layers)
        return extended(backbone, DSparkConfig, **heads)


def check_heads(cfg: DSparkConfig) -> None:
    """One-line errors for the heads' settings."""
    if cfg.markov_rank < 1:
        raise DraftsmithError(
            f"dspark: markov_rank must be at least 1 (no Markov head is DFlash), got {cfg.markov_rank}"
        )
    if not 0.0 <= cfg.threshold <= 1.0:
        raise DraftsmithError(f"dspark: threshold must be in [0, 1] (a survival probability), got {cfg.threshold}")


class MarkovHead(nn.Module):
    """The vanilla Markov head: a rank-r logit bias from the previous token, w2(w1[prev])."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)  # speculators' init: starts as DFlash
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(...) previous token ids -> ((..., r) their embeddings, (..., V) the logit bias)."""
        emb = self.markov_w1(prev)
        return emb, self.markov_w2(emb)


class ConfidenceHead(nn.Module):
    """Per-position acceptance logit from the mask's state (and the previous token's Markov embedding)."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


@register("dspark", config=DSparkConfig)
class DSparkModel(DFlashModel):
    """DFlash's network plus the Markov and confidence heads (trainable; the embedding and LM head stay frozen)."""

    method = "dspark"

    def __init__(self, cfg: DSparkConfig) -> None:
        check_heads(cfg)
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.markov_rank)
        extra = cfg.markov_rank if cfg.confidence_with_markov else 0
        self.confidence_head = ConfidenceHead(cfg.shape.hidden_size + extra)

    def as_drafter(self, topk_accuracy: list[list[float]] | None = None) -> DSparkDrafter:
        return DSparkDrafter(self, topk_accuracy)

    def heads(self, hidden: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(..., H) mask states and (...) the tokens before them -> ((..., V) Markov-corrected logits, (...)
        confidence logits)."""
        emb, bias = self.markov_head(prev)
        return self.lm_head(hidden) + bias, self.confidence(hidden, emb)

    def confidence(self, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """(..., H) mask states, (..., r) the previous tokens' Markov embeddings -> (...) confidence logits."""
        features = torch.cat([hidden, emb], -1) if self.cfg.confidence_with_markov else hidden
        return self.confidence_head(features)

    def block_prev(self, input_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """(B, n, depth) teacher-forced previous tokens: mask d of anchor a follows x_{a+d+1} (the committed token
        for d = 0), clamped inside the row (past it nothing is checked)."""
        steps = anchors[:, None] + 1 + torch.arange(self.cfg.depth, device=anchors.device)
        return input_ids[:, steps.clamp(max=input_ids.shape[1] - 1)]

    def forward_heads(self, input_ids: torch.Tensor, features, valid: torch.Tensor, anchors: torch.Tensor):
        """Training: DFlash's blocks (``hidden``) through both heads with the true previous tokens: ((B, n, depth, V)
        logits, (B, n, depth) confidence logits)."""
        return self.heads(self.hidden(input_ids, features, valid, anchors), self.block_prev(input_ids, anchors))

    def forward(self, input_ids: torch.Tensor, features, valid: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """(B, n, depth, V) Markov-corrected logits of each anchor's masks (as ``DFlashModel.forward``)."""
        return self.forward_heads(input_ids, features, valid, anchors)[0]


@dataclass
class Round:
    """One round's backbone output, shared by ``root`` and ``grow``."""

    base: torch.Tensor
    """(depth, V) base logits lm_head(h_d)."""
    hidden: torch.Tensor
    """(depth, H) the masks' normed states."""


class DSparkDrafter(DFlashDrafter):
    """One block forward per round, then the Markov head left to right; chains are cut by the confidence head.

    Trees grow as for any parallel drafter, each node's child row biased by the node's own token. A chain proposes
    the block's positions whose survival (the product of the confidences, each read with the token drafted before
    it) is at least ``threshold``; the decision for a position never looks at its own token, so sampling stays
    lossless.

    Attributes:
        threshold: the confidence cut (0: every position up to k, as DFlash).
    """

    def __init__(self, model: DSparkModel, topk_accuracy: list[list[float]] | None = None) -> None:
        super().__init__(model, topk_accuracy)
        self.threshold = model.cfg.threshold

    @property
    def adaptive(self) -> bool:
        """Cuts its chains below k where its head predicts rejections (``--k auto`` then calibrates it as it drafts)."""
        return self.threshold > 0

    def _round(self, state: DFlashState) -> Round:
        hidden = self.block_hidden(state)
        return Round(self.model.lm_head(hidden).float(), hidden)

    def _bias(self, tokens: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.markov_head(torch.tensor(tokens, device=device))

    @torch.no_grad()
    def root(self, state: DFlashState) -> tuple[Round, torch.Tensor]:
        scratch = self._round(state)
        return scratch, scratch.base[0] + self._bias([state.tokens[-1]], scratch.base.device)[1][0].float()

    def grow(self, state, scratch: Round, tokens, parents, new) -> torch.Tensor:
        depth, p = 1, parents[new[0]]
        while p >= 0:
            depth, p = depth + 1, parents[p]
        return scratch.base[depth] + self._bias([tokens[i] for i in new], scratch.base.device)[1].float()

    @torch.no_grad()
    def _chain(self, state: DFlashState, k: int, sampling, generator) -> Draft:
        scratch, logits = self.root(state)  # the first token's logits through ``root``, as every tree drafter's
        prev, survival = state.tokens[-1], 1.0
        tokens, qs = [], []
        for i in range(k):
            emb, bias = self._bias([prev], scratch.base.device)
            if self.threshold > 0:
                survival *= float(torch.sigmoid(self.model.confidence(scratch.hidden[i], emb[0]).float()))
                if tokens and survival < self.threshold:
                    break
            q = probs(logits if i == 0 else scratch.base[i] + bias[0].float(), sampling)
            prev = int(q.argmax()) if sampling.greedy else sample(q, generator)
            tokens.append(prev)
            qs.append(q)
        return Draft.chain(tokens, torch.stack(qs))
