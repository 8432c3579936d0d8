"""Drafting across vocabularies: a draft LM with its own tokenizer drafts for a target, its tokens translated through
text (the approach of HF's universal assisted generation and OmniDraft's starting point).

Each round the committed target tokens are decoded to text and encoded with the draft tokenizer (its KV cache kept
for the common prefix, as ``DraftLM`` keeps its own), the draft LM continues greedily, and its continuation's text is
encoded with the target tokenizer after the last few committed tokens' text, so a token spanning the boundary
re-forms as the target would form it. The target tokens whose text lies wholly inside the draft's continuation are
the draft (the last one, which a further draft token could still change, is dropped). Drafts are deterministic
given the context (greedy, in the draft's vocabulary), so the verifier treats them as point masses: greedy output
equals plain greedy decoding and sampling stays lossless, whatever the two tokenizers.

A translation memo (``memo``) keeps the target tokens of recent (boundary text, continuation) pairs: a repeated
continuation is not re-encoded (OmniDraft keeps such a cache of frequent translations).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, DynamicCache, PreTrainedModel

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput, load_causal_lm, model_dir, new_cache, rollback
from draftsmith.errors import DraftsmithError

BOUNDARY = 3
"""Committed target tokens re-encoded with the draft's text, so the first drafted token forms as the target would."""
CONTEXT_TEXT = 8
"""Draft tokens of context decoded with the drafted ones to find the continuation's text (bounded work per token)."""


@dataclass
class CrossVocabState:
    ids: list[int]
    """Committed target tokens."""
    cache: DynamicCache
    cached: list[int] = field(default_factory=list)
    """Draft-vocabulary tokens whose keys/values the cache holds."""


class CrossVocabDrafter(Drafter):
    """A draft LM of another vocabulary drafting for the target (``xvocab:DIR`` in drafter specs).

    Args:
        model: the draft causal LM.
        tokenizer: its tokenizer.
        target_tokenizer: the target's; both must turn the target's text into tokens and back.
        memo_size: translations remembered (0: none).
    """

    def __init__(self, model: PreTrainedModel, tokenizer, target_tokenizer, memo_size: int = 4096) -> None:
        self.model, self.tokenizer, self.target_tokenizer = model.eval(), tokenizer, target_tokenizer
        self._last_only = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        )
        self.memo: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self.memo_size, self.memo_hits, self.translations = memo_size, 0, 0

    @classmethod
    def from_pretrained(cls, path: str | Path, target_tokenizer, device: str = "cpu") -> CrossVocabDrafter:
        path = model_dir(path, "drafter")
        if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
            raise DraftsmithError(
                f"drafter 'xvocab:{path}': no tokenizer in {path} (a cross-vocabulary draft needs its own)"
            )
        model = load_causal_lm(path, "float32", device, "drafter")
        tokenizer = AutoTokenizer.from_pretrained(path)
        drafter = cls(model, tokenizer, target_tokenizer)
        drafter.check_round_trip(path)
        return drafter

    def check_round_trip(self, where: str | Path = "drafter") -> None:
        """Refuse a draft tokenizer that cannot carry the target's text (e.g. a word-level one with unknown words)."""
        sample = "Hello, world! The answer is 42.\n\tdef f(x): return x ** 2  # ünïcode"
        again = self.tokenizer.decode(self.tokenizer.encode(sample, add_special_tokens=False))
        if again != sample:
            raise DraftsmithError(
                f"drafter 'xvocab:{where}': its tokenizer does not round-trip text ({sample!r} came back as "
                f"{again!r}), so its drafts cannot be translated into the target's tokens"
            )

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> CrossVocabState:
        return CrossVocabState(ids=tokens.tolist(), cache=new_cache())

    @torch.no_grad()
    def _feed(self, state: CrossVocabState, new: list[int]) -> torch.Tensor:
        ids = torch.tensor([new], device=self.model.device)
        out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True, **self._last_only)
        state.cached.extend(new)
        return out.logits[0, -1]

    def propose(self, state: CrossVocabState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        context = self.tokenizer.encode(self.target_tokenizer.decode(state.ids), add_special_tokens=False)
        if not context or k <= 0:
            return Draft.empty()
        keep = 0
        limit = min(len(state.cached), len(context) - 1)  # the last context token is fed to get the next logits
        while keep < limit and state.cached[keep] == context[keep]:
            keep += 1
        rollback(state.cache, keep)
        del state.cached[keep:]
        logits = self._feed(state, context[keep:])
        recent = context[-CONTEXT_TEXT:]
        tail = state.ids[-BOUNDARY:]
        boundary, base = self.target_tokenizer.decode(tail), self.tokenizer.decode(recent)
        drafted: list[int] = []
        proposal: list[int] = []
        for _ in range(2 * k + 4):  # draft tokens until k target tokens lie wholly inside the continuation
            drafted.append(int(logits.argmax()))
            full = self.tokenizer.decode(recent + drafted)
            continuation = full[len(base) :] if full.startswith(base) else self.tokenizer.decode(drafted)
            proposal = self._translate(boundary, continuation, tail)
            if len(proposal) > k:
                break
            logits = self._feed(state, [drafted[-1]])
        return Draft.chain(proposal[: min(k, max(0, len(proposal) - 1))])

    def _translate(self, boundary: str, continuation: str, tail: list[int]) -> list[int]:
        """Target tokens of the draft's continuation, formed after the committed boundary tokens' text (the
        continuation alone where the boundary does not re-form as it was committed)."""
        key = (boundary, continuation)
        self.translations += 1
        if key in self.memo:
            self.memo_hits += 1
            self.memo.move_to_end(key)
            return self.memo[key]
        ids = self.target_tokenizer.encode(boundary + continuation, add_special_tokens=False)
        if ids[: len(tail)] == tail:
            out = ids[len(tail) :]
        else:
            out = self.target_tokenizer.encode(continuation, add_special_tokens=False)
        if self.memo_size:
            self.memo[key] = out
            if len(self.memo) > self.memo_size:
                self.memo.popitem(last=False)
        return out

    def advance(self, state: CrossVocabState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.ids.extend(tokens.tolist())

    def extra_metrics(self, results) -> dict:
        return {"translation_memo_hits": round(self.memo_hits / max(1, self.translations), 3)}
