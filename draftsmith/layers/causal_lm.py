"""Any HF causal LM that shares the target's tokenizer, as a drafter: ``DraftLM`` drafts with its own KV cache and
``DraftLMNetwork`` is the trainable network. The draft LM family trains and registers it (``families/draft_lm``); S2D,
PARD, cross-vocabulary drafting, OSD and SpecDec++'s head build on it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from draftsmith.core.draft import Draft, DrafterNetwork
from draftsmith.core.fingerprint import tokenizer_hash
from draftsmith.core.hf_cache import cache_arg, takes
from draftsmith.core.sampling import Sampling, probs, sample
from draftsmith.core.target import TargetOutput, compiled_forward, load_causal_lm, model_dir, new_cache, rollback
from draftsmith.core.trees import TreeKind
from draftsmith.errors import DraftsmithError
from draftsmith.layers.tree_draft import TreeDrafter


@dataclass
class DraftLMState:
    ids: list[int]
    cache: DynamicCache
    cached: list[int] = field(default_factory=list)
    """The tokens whose keys/values the cache holds (a prefix of ids + the last draft)."""


class DraftLM(TreeDrafter):
    """Autoregressive drafting with a small causal LM: chains, or (``score --tree``) token trees grown one depth
    per forward, the frontier's nodes as a batch over the cache (rows re-selected from their parents' at each depth),
    e.g. several sampled drafts for the multi-draft rules (``--tree sampled``).

    Args:
        model: the draft model; its output vocabulary must equal the target's.
        tokenizer: its tokenizer, used to check it matches the target's.
        stop_below: stop a round's draft after a token the draft model gave less than this probability (the token
            itself is kept), as HF assisted generation's confidence threshold does; 0 drafts all k tokens. Which
            tokens are drafted never changes what the verifier outputs, only how many target forwards it takes.
    """

    def __init__(self, model: PreTrainedModel, tokenizer=None, stop_below: float = 0.0) -> None:
        if not 0 <= stop_below <= 1:
            raise DraftsmithError(f"drafter: the confidence threshold must be in [0, 1], got {stop_below}")
        self.stop_below = stop_below
        self.model = model.eval()
        # the last position's logits are all a round reads (HF causal LMs that take ``logits_to_keep``)
        self._last_only = {"logits_to_keep": 1} if takes(model, "logits_to_keep") else {}
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.tokenizer_hash = tokenizer_hash(tokenizer) if tokenizer is not None else None
        self._forward = model.__call__

    def compile(self) -> None:
        self._forward = compiled_forward(self.model)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: str = "float32", device: str = "cpu", stop_below: float = 0.0
    ) -> DraftLM:
        path = model_dir(path, "drafter")
        model = load_causal_lm(path, dtype, device, "drafter")
        tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
        return cls(model, tokenizer, stop_below)

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> DraftLMState:
        return DraftLMState(ids=tokens.tolist(), cache=new_cache())

    @torch.no_grad()
    def _logits(self, state: DraftLMState, new: list[int]) -> torch.Tensor:
        ids = torch.tensor([new], device=self.model.device)
        out = self._forward(input_ids=ids, **cache_arg(self.model, state.cache), use_cache=True, **self._last_only)
        state.cached.extend(new)
        return out.logits[0, -1].float()

    def root(self, state: DraftLMState) -> tuple[dict[int, int], torch.Tensor]:
        """Tree rounds: the committed context cached (one batch row), the first draft token's logits; the scratch maps
        each frontier node to its cache row (-1: the root)."""
        return {-1: 0}, self._logits(state, state.ids[len(state.cached) :])

    @torch.no_grad()
    def grow(self, state: DraftLMState, scratch: dict[int, int], tokens, parents, new) -> torch.Tensor:
        state.cache.batch_select_indices(torch.tensor([scratch[parents[i]] for i in new]))
        ids = torch.tensor([[tokens[i]] for i in new], device=self.model.device)
        out = self._forward(input_ids=ids, **cache_arg(self.model, state.cache), use_cache=True, **self._last_only)
        scratch.clear()
        scratch.update({node: row for row, node in enumerate(new)})
        return out.logits[:, -1].float()

    def propose(self, state: DraftLMState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        if self.tree.kind is not TreeKind.CHAIN:
            draft = super().propose(state, k, sampling, generator)
            state.cache.batch_select_indices(torch.tensor([0]))  # every row shares the committed prefix
            rollback(state.cache, len(state.cached))
            return draft
        _, logits = self.root(state)  # the first token's logits through ``root``, as every tree drafter's
        tokens, qs = [], []
        for i in range(k):
            if sampling.greedy:  # deterministic: the verifier needs no q (a point mass on each token)
                tokens.append(int(logits.argmax()))
            else:
                qs.append(probs(logits, sampling))
                tokens.append(sample(qs[-1], generator))
            if self.stop_below and self._confidence(logits, tokens[-1], qs, sampling) < self.stop_below:
                break
            if i < k - 1:
                logits = self._logits(state, [tokens[-1]])
        return Draft.chain(tokens, torch.stack(qs) if qs else None)

    @staticmethod
    def _confidence(logits: torch.Tensor, token: int, qs: list[torch.Tensor], sampling: Sampling) -> float:
        """The draft model's probability of the token it just drafted (its softmax for greedy drafts, else q)."""
        return float(qs[-1][token]) if not sampling.greedy else float(torch.softmax(logits, -1)[token])

    def advance(self, state: DraftLMState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.ids.extend(tokens.tolist())
        self.sync(state)

    @staticmethod
    def sync(state: DraftLMState) -> None:
        """Roll the cache back to the longest prefix of ``state.ids`` it holds (never the last id: the next round
        feeds it to get its logits)."""
        keep = 0
        limit = min(len(state.cached), len(state.ids) - 1)  # never cache the last id: propose needs its logits
        while keep < limit and state.cached[keep] == state.ids[keep]:
            keep += 1
        rollback(state.cache, keep)
        del state.cached[keep:]


@dataclass
class DraftLMConfig:
    """A trained draft LM: its Hugging Face config and, for a LoRA-trained one, the adapter's settings."""

    hf_config: dict = field(default_factory=dict)
    """``PretrainedConfig.to_dict()`` of the causal LM (``model_type`` selects the architecture)."""
    lora: dict | None = None
    """``peft.LoraConfig`` arguments when the weights hold an unmerged LoRA adapter; None for plain weights."""


class DraftLMNetwork(DrafterNetwork):
    """The trainable draft LM: an HF causal LM (optionally wrapped by a peft LoRA adapter), in the shape
    ``core/native.py`` saves and ``families/registry.py`` rebuilds (``method``, ``cfg``, ``as_drafter``).

    Args:
        cfg: the HF config (and LoRA settings) to build.
        model: an already built model for ``cfg.hf_config`` (e.g. loaded with ``from_pretrained``);
            None builds a freshly initialised one.
    """

    method = "draft_lm"

    def __init__(self, cfg: DraftLMConfig, model: PreTrainedModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if model is None:
            hf = AutoConfig.for_model(**cfg.hf_config)
            model = AutoModelForCausalLM.from_config(hf)
        if cfg.lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **cfg.lora))
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) next-token logits."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def merged(self) -> DraftLMNetwork:
        """This network with any LoRA adapter merged into the base weights (peft ``merge_and_unload``)."""
        if self.cfg.lora is None:
            return self
        base = copy.deepcopy(self.model).merge_and_unload()
        return DraftLMNetwork(DraftLMConfig(self.cfg.hf_config, None), base)

    @property
    def output_size(self) -> int:
        return self.cfg.hf_config["hidden_size"]

    def for_export(self) -> DraftLMNetwork:
        """What ``save_native`` writes: plain (merged) weights."""
        return self.merged()

    def as_drafter(self, topk_accuracy: list | None = None) -> DraftLM:
        """The verifier's drafter (LoRA merged first). ``topk_accuracy`` is unused: a draft LM drafts chains."""
        return DraftLM(self.merged().model)
