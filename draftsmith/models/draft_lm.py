"""DraftLM: any HF causal LM that shares the target's tokenizer, drafting with its own KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from draftsmith.errors import DraftsmithError
from draftsmith.eval.sampling import Sampling, probs, sample
from draftsmith.models.base import Draft, Drafter
from draftsmith.target import TargetOutput, rollback, tokenizer_hash


@dataclass
class DraftLMState:
    ids: list[int]
    cache: DynamicCache
    cached: list[int] = field(default_factory=list)
    """The tokens whose keys/values the cache holds (a prefix of ids + the last draft)."""


class DraftLM(Drafter):
    """Autoregressive drafting with a small causal LM.

    Args:
        model: the draft model; its output vocabulary must equal the target's.
        tokenizer: its tokenizer, used to check it matches the target's.
    """

    def __init__(self, model: PreTrainedModel, tokenizer=None) -> None:
        self.model = model.eval()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.tokenizer_hash = tokenizer_hash(tokenizer) if tokenizer is not None else None

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "float32", device: str = "cpu") -> DraftLM:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise DraftsmithError(f"drafter: {path} is not a model directory (no config.json)")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
        tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
        return cls(model, tokenizer)

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> DraftLMState:
        return DraftLMState(ids=tokens.tolist(), cache=DynamicCache(config=self.model.config))

    @torch.no_grad()
    def _logits(self, state: DraftLMState, new: list[int]) -> torch.Tensor:
        ids = torch.tensor([new], device=self.model.device)
        out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True)
        state.cached.extend(new)
        return out.logits[0, -1].float()

    def propose(self, state: DraftLMState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        logits = self._logits(state, state.ids[len(state.cached) :])
        tokens, qs = [], []
        for i in range(k):
            q = probs(logits, sampling)
            token = int(q.argmax()) if sampling.greedy else sample(q, generator)
            tokens.append(token)
            qs.append(q)
            if i < k - 1:
                logits = self._logits(state, [token])
        return Draft.chain(tokens, torch.stack(qs) if qs else None)

    def advance(self, state: DraftLMState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.ids.extend(tokens.tolist())
        keep = 0
        limit = min(len(state.cached), len(state.ids) - 1)  # never cache the last id: propose needs its logits
        while keep < limit and state.cached[keep] == state.ids[keep]:
            keep += 1
        rollback(state.cache, keep)
        del state.cached[keep:]
