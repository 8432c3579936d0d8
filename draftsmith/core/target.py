"""The frozen target model: logits, selected hidden states and a KV cache that can be rolled back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

from draftsmith.core.dtypes import DTYPES, torch_dtype
from draftsmith.core.fingerprint import config_hash, tokenizer_hash
from draftsmith.core.hf_cache import cache_arg, output_cache, takes
from draftsmith.core.numerics import INVARIANT_ATTENTION, is_batch_invariant, make_batch_invariant
from draftsmith.errors import DraftsmithError

# Layer types whose attention draftsmith can express in one additive mask (see ``Target.layer_masks``).
ATTENTION_TYPES = ("full_attention", "sliding_attention")
# cache layer types (transformers >= 5.25) that hold a recurrent or convolution state instead of, or beside, a KV cache
RECURRENT_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding"})
# Attention implementations that apply a custom 4D mask as given (flash attention ignores it); the batch-invariant
# one lays each tree query's keys out as its one-token step does (``numerics._tree_groups``).
MASKED_ATTENTION = ("eager", "sdpa", INVARIANT_ATTENTION)


@dataclass
class TargetOutput:
    """What one target forward returns.

    Attributes:
        logits: (B, T, V) next-token logits at every position.
        features: one (B, T, H) tensor per requested feature layer; index ``i`` of
            ``Target.feature_layers`` is HF ``hidden_states[i]`` (0 = embeddings,
            ``num_layers`` = the final, normed hidden state).
        past_key_values: the cache, extended by T positions.
    """

    logits: torch.Tensor
    features: tuple[torch.Tensor, ...]
    past_key_values: DynamicCache | None = None
    vocab: torch.Tensor | None = None
    """The token ids ``logits``' last dim covers, in order (None: the whole vocabulary); see ``logits_over``."""

    def logits_over(self, ids: torch.Tensor) -> torch.Tensor:
        """(..., len(ids)) logits of the tokens ``ids``: ``logits`` itself when it covers exactly ``ids``."""
        if self.vocab is None:
            return self.logits[..., ids]
        if self.vocab is ids or torch.equal(self.vocab, ids):
            return self.logits
        raise ValueError("TargetOutput.logits cover another token subset than the one asked for")

    def positions(self, index: torch.Tensor | slice) -> TargetOutput:
        """The first batch row at ``index`` positions, without batch dim: logits (n, V), features (n, H); the cache
        is passed along (self-drafters share the target's)."""
        return TargetOutput(self.logits[0, index], tuple(f[0, index] for f in self.features), self.past_key_values)


def new_cache() -> DynamicCache:
    """A KV cache that keeps every position of every layer, so it can be cropped and re-indexed.

    ``DynamicCache(config=...)`` gives sliding-window layers a cache that forgets what left the
    window and counts positions in its own ``cumulative_length``: it can be neither rolled back
    past the window nor re-indexed after a tree round. Keeping full layers costs the memory of
    the dropped positions; the model's masks still apply each layer's window.
    """
    return DynamicCache()


def rollback(cache: DynamicCache, length: int) -> None:
    """Crop ``cache`` (from ``new_cache``) back to its first ``length`` positions."""
    excess = cache.get_seq_length() - length
    if excess < 0:
        raise ValueError(f"cannot roll a cache of {cache.get_seq_length()} positions forward to {length}")
    if excess:
        cache.crop(-excess)


def keep_positions(cache: DynamicCache, keep: list[int]) -> None:
    """Keep only the cache entries at ``keep`` (in that order): after a tree round, the committed
    context plus the accepted path. ``cache`` must come from ``new_cache`` (full layers)."""
    index = torch.tensor(keep)
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"keep_positions needs full cache layers (new_cache()), not {type(layer).__name__}")
        layer.keys = layer.keys.index_select(-2, index.to(layer.keys.device))
        layer.values = layer.values.index_select(-2, index.to(layer.values.device))


def attention_windows(model: PreTrainedModel) -> dict[str, int | None]:
    """The model's attention layer types and each one's sliding window (None: full attention).

    Refuses, naming the architecture, a model draftsmith cannot verify drafts on exactly: one with a
    recurrent state (no KV cache to roll back), one that takes no position ids (draft tokens sit at
    chosen positions), or one with attention layers other than full and sliding-window ones.
    """
    arch = type(model).__name__
    types, kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    # transformers before 5.25 marks such models `_is_stateful`; from 5.25 their cache layers are typed recurrent
    if getattr(model, "_is_stateful", False) or RECURRENT_TYPES.intersection(types):
        raise DraftsmithError(
            f"target: {arch} keeps a recurrent state, which cannot be rolled back to before a rejected draft; "
            f"draftsmith needs a target whose every layer is attention with a KV cache"
        )
    if not takes(model, "position_ids"):
        raise DraftsmithError(
            f"target: {arch} takes no position_ids, which draftsmith needs to place draft tokens (tree drafts "
            f"put siblings at the same position)"
        )
    if isinstance(kwargs, dict):  # transformers before 5.2x: one dict for all layers, its window the sliding ones'
        kwargs = [{} if kind == "full_attention" else kwargs for kind in types]
    windows: dict[str, int | None] = {}
    for kind, kw in zip(types, kwargs, strict=True):
        if kind not in ATTENTION_TYPES:
            raise DraftsmithError(
                f"target: {arch} has {kind} layers; draftsmith verifies drafts only on full and sliding-window "
                f"attention layers"
            )
        window = kw.get("sliding_window")
        if windows.setdefault(kind, window) != window:
            raise DraftsmithError(f"target: {arch} has {kind} layers with different windows; draftsmith needs one")
    return windows


def compiled_forward(model: torch.nn.Module):
    """``torch.compile`` of ``model.forward`` with dynamic shapes, for decoding: the KV cache grows and the number of
    new tokens changes from round to round, so one graph must serve every length (a static-shape compile would
    recompile on each). Compiling takes seconds per new shape family the first time; afterwards a small model's
    forward costs about half its eager time on CPU, where Python and dispatch overhead dominate. The model's own
    weights are used (nothing is copied); its ``__call__`` stays eager.

    Every model of one class shares the compiled code of its ``forward``, and each model and shape family (prefill,
    one token, several) adds a graph to it: a target and its draft LM of one family reach dynamo's default limit of
    8 graphs per function, after which it silently runs eager, so the limit is raised to 64 here.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(model.forward, dynamic=True)


def model_dir(path: str | Path, what: str) -> Path:
    """``path`` as a Path, refused in one line naming ``what`` when it holds no ``config.json``."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"{what}: {path} is not a model directory (no config.json)")
    return path


def load_causal_lm(path: Path, dtype: str, device: str, what: str) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` with an unreadable weights file reported on one line."""
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype)).to(device)
    except SafetensorError as e:
        files = ", ".join(str(f) for f in sorted(Path(path).glob("*.safetensors"))) or str(path)
        raise DraftsmithError(f"{what}: cannot read the weights in {files} (truncated or corrupt: {e})") from None


class Target:
    """A frozen HF causal LM with its tokenizer.

    Args:
        model: any ``PreTrainedModel`` with a causal LM head.
        tokenizer: its tokenizer (may be None for tokenizer-free use in tests).
        feature_layers: indices into HF ``hidden_states`` to return as features;
            negative indices count from the end (-1 = final normed hidden state).
        name: path or hub name recorded in the fingerprint.
        batch_invariant: compute every row as it would be computed alone (``core.numerics``), so that greedy
            speculative decoding equals plain greedy decoding bit for bit; None: on for bfloat16 and float16
            models (where kernels round differently by row count), off for float32.

    Raises:
        DraftsmithError: for an architecture whose drafts cannot be verified exactly (``attention_windows``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer=None,
        feature_layers: tuple[int, ...] = (-1,),
        name: str = "",
        batch_invariant: bool | None = None,
    ) -> None:
        self.attention_windows = attention_windows(model)
        if batch_invariant is None:
            batch_invariant = model.dtype != torch.float32
        if batch_invariant and not is_batch_invariant(model):
            make_batch_invariant(model)
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name or str(getattr(model.config, "_name_or_path", ""))
        self.feature_layers = self._check_layers(feature_layers)
        self._final_logits_checked = False
        self._forward = self.model.__call__
        self.compiled = False
        """Whether forwards run through ``compiled_forward`` (``compile``)."""

    def compile(self) -> None:
        """Run every later forward through ``compiled_forward`` (``draftsmith score --compile``)."""
        self._forward = compiled_forward(self.model)
        self.compiled = True

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        feature_layers: tuple[int, ...] = (-1,),
        dtype: str = "float32",
        device: str = "cpu",
        batch_invariant: bool | None = None,
    ) -> Target:
        """Load a local model + tokenizer dir with ``from_pretrained`` in ``dtype`` (built-in names and ``auto``:
        ``targets.load_target``)."""
        path = model_dir(path, "target")
        model = load_causal_lm(path, dtype, device, "target")
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, feature_layers, name=str(path), batch_invariant=batch_invariant)

    @classmethod
    def from_config(cls, path: str | Path, feature_layers: tuple[int, ...] = (-1,), dtype: str = "float32") -> Target:
        """The target of a local model dir without its weights (on the meta device): its tokenizer, EOS list, context
        and fingerprint (in ``dtype``), for work another process does with the weights (``generate --engine vllm``)."""
        from transformers import AutoConfig, GenerationConfig

        path = model_dir(path, "target")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch_dtype(dtype))
        if (path / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(path)
        return cls(model, AutoTokenizer.from_pretrained(path), feature_layers, name=str(path), batch_invariant=False)

    def _check_layers(self, layers: tuple[int, ...]) -> tuple[int, ...]:
        n = self.num_layers
        out = []
        for layer in layers:
            resolved = layer + n + 1 if layer < 0 else layer
            if not 0 <= resolved <= n:
                raise DraftsmithError(
                    f"feature_layers: {layer} is out of range for a target with {n} layers "
                    f"(valid: 0..{n} or -{n + 1}..-1)"
                )
            out.append(resolved)
        return tuple(out)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> str:
        """The dtype the target computes in, by name (``float32``, ``bfloat16``, ``float16``)."""
        return next(name for name, d in DTYPES.items() if d == self.model.dtype)

    @property
    def batch_invariant(self) -> bool:
        """Whether its rows are computed as they would be alone (``core.numerics``)."""
        return is_batch_invariant(self.model)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token that ends a generation: the ``eos_token_id`` (an id or a list) of the config and of the
        generation config together, since ``generate`` stops at any id its generation config lists."""
        ids: list[int] = []
        for source in (self.config, getattr(self.model, "generation_config", None)):
            eos = getattr(source, "eos_token_id", None)
            for token in [] if eos is None else eos if isinstance(eos, (list, tuple)) else [eos]:
                if int(token) not in ids:
                    ids.append(int(token))
        return tuple(ids)

    @property
    def eos_token_id(self) -> int | None:
        """The first of ``eos_token_ids`` (for APIs that take one id); decoding stops at any of ``eos_token_ids``."""
        ids = self.eos_token_ids
        return ids[0] if ids else None

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def final_logits(self, hidden: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """The target's logits from its final normed hidden state (HF ``hidden_states[-1]``): its LM head, then
        what its family applies after the head (Gemma-2/3's soft-capping, Cohere's ``logit_scale``, Granite's
        ``logits_scaling``), as its forward does. Float32, like ``TargetOutput.logits``. ``vocab``: only these
        token ids' logits (the head's rows for them; (..., len(vocab))), what a reduced-vocabulary drafter's loss
        reads, at a fraction of the full head's cost."""
        head = self.lm_head
        if vocab is None:
            logits = head(hidden.to(head.weight.dtype)).float()
        else:
            bias = head.bias[vocab] if getattr(head, "bias", None) is not None else None
            logits = torch.nn.functional.linear(hidden.to(head.weight.dtype), head.weight[vocab], bias).float()
        config = self.config.get_text_config(decoder=True)
        if getattr(config, "final_logit_softcapping", None) is not None:
            cap = config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        if config.model_type.startswith("cohere") and getattr(config, "logit_scale", None) is not None:
            logits = logits * config.logit_scale
        if getattr(config, "logits_scaling", None) is not None:
            logits = logits / config.logits_scaling
        return logits

    @torch.no_grad()
    def check_final_logits(self, what: str) -> None:
        """Refuse in one line a target whose logits are something else than ``final_logits`` of its final state
        (a family applying another transform after its LM head), for ``what`` recomputes them that way. Runs one
        4-token forward, the first time only."""
        if self._final_logits_checked:
            return
        ids = torch.arange(4, device=self.device)[None] % self.vocab_size
        out = self.model(input_ids=ids, output_hidden_states=True)
        tol = max(1e-4, 4 * torch.finfo(out.logits.dtype).eps)  # bf16 / fp16 targets transform in their precision
        if not torch.allclose(self.final_logits(out.hidden_states[-1]), out.logits.float(), rtol=tol, atol=tol):
            raise DraftsmithError(
                f"{what}: {type(self.model).__name__} transforms its LM head's output in a way draftsmith does "
                f"not know, so its logits cannot be recomputed from cached hidden states; train online"
            )
        self._final_logits_checked = True

    def new_cache(self) -> DynamicCache:
        """An empty KV cache that ``rollback`` and ``keep_positions`` can cut (see ``new_cache``)."""
        return new_cache()

    def layer_masks(
        self, mask: torch.Tensor, position_ids: torch.Tensor, past: int
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """A custom additive mask as the model's attention layers need it: each sliding-window layer also
        masks keys that left its window (a 4D mask reaches the layers as given; the model adds no window).

        Args:
            mask: (1, 1, T, past + T) additive mask over the cached positions 0..past-1 and the T new ones.
            position_ids: (1, T) positions of the new tokens.
            past: positions the cache holds.

        Returns:
            the mask for every layer when all layers share an attention type, else one mask per layer type
            (the mapping the models with mixed full/sliding layers accept as ``attention_mask``).
        """
        impl = self.config._attn_implementation
        if impl not in MASKED_ATTENTION:
            raise DraftsmithError(
                f"target: tree drafts pass a 4D attention mask, which {impl} attention ignores; load the target "
                f"with attn_implementation='sdpa' (or 'eager'), or draft chains"
            )
        q_pos = position_ids[0].to(mask.device)  # (T,)
        kv_pos = torch.cat([torch.arange(past, device=mask.device), q_pos])  # (past + T,)
        distance = q_pos[:, None] - kv_pos[None, :]  # (T, past + T)
        masks = {}
        for kind, window in self.attention_windows.items():
            masks[kind] = mask if window is None else mask.masked_fill(distance >= window, torch.finfo(mask.dtype).min)
        return next(iter(masks.values())) if len(masks) == 1 else masks

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        past_key_values: DynamicCache | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        with_features: bool = True,
        feature_layers: tuple[int, ...] | None = None,
        last_logits_only: bool = False,
    ) -> TargetOutput:
        """Forward ``input_ids`` (B, T) after whatever ``past_key_values`` holds.

        ``feature_layers`` (resolved, non-negative) overrides ``self.feature_layers`` for this call.
        ``last_logits_only``: the LM head runs on the last position only (``logits`` (B, 1, V)), for callers that
        want the hidden states (the feature cache): on a 49k vocabulary the head over every position costs more
        than the layers.
        A 4D ``attention_mask`` (tree drafts) is a custom mask over the cache and the new tokens; each
        sliding-window layer gets it with its window applied (``layer_masks``).
        """
        if attention_mask is not None and attention_mask.dim() == 4:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            if position_ids is None:
                position_ids = torch.arange(past, past + input_ids.shape[1], device=self.device)[None]
            attention_mask = self.layer_masks(attention_mask, position_ids, past)
        out = self._forward(
            input_ids=input_ids.to(self.device),
            **cache_arg(self.model, past_key_values),
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=past_key_values is not None,
            output_hidden_states=with_features,
            **({"logits_to_keep": 1} if last_logits_only and takes(self.model, "logits_to_keep") else {}),
        )
        layers = self.feature_layers if feature_layers is None else feature_layers
        # float32 like the logits: drafters hold float32 weights whatever the target's dtype (values unchanged)
        features = tuple(out.hidden_states[i].float() for i in layers) if with_features else ()
        logits = out.logits[:, -1:] if last_logits_only else out.logits
        return TargetOutput(logits.float(), features, output_cache(out))

    @property
    def fingerprint(self) -> dict:
        """Identity of this target that datasets, checkpoints and exports record (``core.fingerprint``: its hashes and
        ``check_fingerprint``, which compares two)."""
        return {
            "name": self.name,
            "model_type": self.config.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "tokenizer_hash": tokenizer_hash(self.tokenizer) if self.tokenizer is not None else None,
            "config_hash": config_hash(self.config),
            "dtype": self.dtype,
        }
