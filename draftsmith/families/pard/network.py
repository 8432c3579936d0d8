"""PARD (AMD, arXiv 2504.18583): a draft LM that drafts K tokens in one forward.

After the committed tokens it reads K-1 copies of a mask token; the logits at the last committed token and at
mask d predict draft positions 1 and d + 1. The mask token is an id of the target's own vocabulary (the rarest
one in the training data, its embedding row reset to the mean at the start): vLLM's parallel drafting
(``pard_token``) needs it below the target's ``vocab_size``. The student is any HF causal LM sharing the target's
tokenizer that accepts a 4D attention mask (Llama-style), e.g. the distilled draft LM or the target's first
layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from draftsmith.core.draft import DrafterNetwork
from draftsmith.core.hf_cache import cache_arg
from draftsmith.core.target import TargetOutput, new_cache, rollback
from draftsmith.families.registry import register
from draftsmith.layers.parallel import ParallelDrafter, ParallelLayout


@dataclass
class PardConfig:
    """A PARD draft LM: its HF config (vocabulary = the target's + the mask token) and what it drafts."""

    hf_config: dict = field(default_factory=dict)
    """``PretrainedConfig.to_dict()`` of the causal LM (its vocabulary is the target's)."""
    mask_token_id: int = 0
    """The placeholder's token id."""
    depth: int = 4
    """Tokens one forward drafts (the K it was trained for; it drafts fewer when asked)."""


@register("pard", config=PardConfig)
class PardNetwork(DrafterNetwork):
    """The trainable PARD student.

    Args:
        cfg: its config.
        model: an already built causal LM for ``cfg.hf_config``; None builds a fresh one.
    """

    method = "pard"

    def __init__(self, cfg: PardConfig, model: PreTrainedModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = (
            model if model is not None else AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.hf_config))
        )

    def forward(self, input_ids: torch.Tensor, layout: ParallelLayout) -> torch.Tensor:
        """(B, Q) real tokens then placeholders -> (B, Q, V) logits."""
        out = self.model(
            input_ids=input_ids, attention_mask=layout.mask, position_ids=layout.positions, use_cache=False
        )
        return out.logits

    @property
    def output_size(self) -> int:
        return self.cfg.hf_config["hidden_size"]

    def as_drafter(self, topk_accuracy: list | None = None) -> PardDrafter:
        return PardDrafter(self, topk_accuracy)


@dataclass
class PardState:
    ids: list[int]
    cache: object
    cached: int = 0
    """How many of ``ids`` the cache holds (placeholders never stay in it)."""


class PardDrafter(ParallelDrafter):
    """One forward per round: the tokens committed since the last round, then k - 1 mask tokens."""

    def __init__(self, network: PardNetwork, topk_accuracy: list[list[float]] | None = None) -> None:
        self.network = network.eval()
        self.model = network.model
        self.vocab_size = network.model.get_output_embeddings().weight.shape[0]
        self.max_depth = network.cfg.depth
        self.topk_accuracy = topk_accuracy

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> PardState:
        return PardState(tokens.tolist(), new_cache())

    def advance(self, state: PardState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.ids.extend(tokens.tolist())

    @torch.no_grad()
    def block_logits(self, state: PardState, k: int) -> torch.Tensor:
        new = state.ids[state.cached :] + [self.network.cfg.mask_token_id] * (k - 1)
        ids = torch.tensor([new], device=self.model.device)
        out = self.model(input_ids=ids, **cache_arg(self.model, state.cache), use_cache=True, logits_to_keep=k)
        state.cached = len(state.ids)
        rollback(state.cache, state.cached)  # drop the placeholders' keys/values
        return out.logits[0, -k:]
