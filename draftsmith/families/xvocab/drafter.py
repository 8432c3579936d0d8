"""Drafting across vocabularies: a draft LM with its own tokenizer drafts for a target, its tokens translated through
text (the approach of HF's universal assisted generation and OmniDraft's starting point).

Each round the committed target tokens are decoded to text and encoded with the draft tokenizer (a ``DraftLM``'s
state over those tokens keeps its KV cache for the common prefix), the draft LM continues greedily, and its continuation's text is
encoded with the target tokenizer after the last few committed tokens' text, so a token spanning the boundary
re-forms as the target would form it. The target tokens whose text lies wholly inside the draft's continuation are
the draft (the last one, which a further draft token could still change, is dropped). Drafts are deterministic
given the context (greedy, in the draft's vocabulary), so the verifier treats them as point masses: greedy output
equals plain greedy decoding and sampling stays lossless, whatever the two tokenizers.

A translation memo (``memo``) keeps the target tokens of recent (boundary text, continuation) pairs: a repeated
continuation is not re-encoded (OmniDraft keeps such a cache of frequent translations).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import TargetOutput, load_causal_lm, model_dir, new_cache
from draftsmith.errors import DraftsmithError
from draftsmith.layers.causal_lm import DraftLM, DraftLMState

BOUNDARY = 3
"""Committed target tokens re-encoded with the draft's text, so the first drafted token forms as the target would."""
CONTEXT_TEXT = 8
"""Draft tokens of context decoded with the drafted ones to find the continuation's text (bounded work per token)."""


@dataclass
class XVocabState:
    ids: list[int]
    """Committed target tokens."""
    draft: DraftLMState
    """The draft LM's state over the committed text in its own tokens (``ids``) and its cache."""


class XVocabDrafter(Drafter):
    """A draft LM of another vocabulary drafting for the target (``xvocab:DIR`` in drafter specs).

    Args:
        model: the draft causal LM.
        tokenizer: its tokenizer.
        target_tokenizer: the target's; both must turn the target's text into tokens and back.
        memo_size: translations remembered (0: none).
    """

    def __init__(self, model: PreTrainedModel, tokenizer, target_tokenizer, memo_size: int = 4096) -> None:
        self.lm, self.tokenizer, self.target_tokenizer = DraftLM(model), tokenizer, target_tokenizer
        self.memo: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self.memo_size, self.memo_hits, self.translations = memo_size, 0, 0

    @classmethod
    def from_pretrained(cls, path: str | Path, target_tokenizer, device: str = "cpu") -> XVocabDrafter:
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

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> XVocabState:
        return XVocabState(ids=tokens.tolist(), draft=DraftLMState(ids=[], cache=new_cache()))

    def propose(self, state: XVocabState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        context = self.tokenizer.encode(self.target_tokenizer.decode(state.ids), add_special_tokens=False)
        if not context or k <= 0:
            return Draft.empty()
        draft = state.draft
        draft.ids = context
        self.lm.sync(draft)
        logits = self.lm._logits(draft, context[len(draft.cached) :])
        recent = context[-CONTEXT_TEXT:]
        tail = state.ids[-BOUNDARY:]
        boundary, base = self.target_tokenizer.decode(tail), self.tokenizer.decode(recent)
        drafted: list[int] = []
        proposal: list[int] = []
        for step in range(2 * k + 4):  # draft tokens until k target tokens lie wholly inside the continuation
            if step:
                logits = self.lm._logits(draft, [drafted[-1]])
            drafted.append(int(logits.argmax()))
            full = self.tokenizer.decode(recent + drafted)
            continuation = full[len(base) :] if full.startswith(base) else self.tokenizer.decode(drafted)
            proposal = self._translate(boundary, continuation, tail)
            if len(proposal) > k:
                break
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

    def advance(self, state: XVocabState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.ids.extend(tokens.tolist())

    def extra_metrics(self, results) -> dict:
        return {"translation_memo_hits": round(self.memo_hits / max(1, self.translations), 3)}
