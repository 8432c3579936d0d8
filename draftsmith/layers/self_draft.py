"""Self-speculative drafting: the target's own layers draft for it (Kangaroo, SWIFT-style layer skipping).

A ``SelfDrafter`` runs one token at a time through a subset of the target's decoder layers, then an exit (Kangaroo's
trained adapter, or the target's final norm) and the target's LM head:

- the first ``shared`` layers see exactly the target's inputs, so their keys/values of the committed tokens are the
  target's own: they are read from the target's KV cache (``target_out.past_key_values``, left by the verification
  pass), the round's draft tokens are appended to it, and it is cropped back when the draft is done. Nothing is
  recomputed for the committed tokens.
- ``own`` later layers (what layer skipping keeps after its first skipped layer) see other inputs than the
  target's, so they keep their own cache. It is caught up on the committed tokens from the target's hidden state
  after layer ``shared``, a feature of the verification pass, so catching up costs those layers only.

Drafting stops early (Kangaroo's second early exit) after the first token whose top-1 probability is below
``threshold``: that token is not drafted. The choice depends on the drafter's own distributions only, so the
verifier stays exact and lossless.

The target must be a decoder with ``layers``, ``rotary_emb`` and ``norm`` (Llama, Qwen, Mistral, SmolLM...) whose
``hidden_states[0]`` is its token embedding. Sliding windows are not applied while drafting: the drafts change, the
output does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from draftsmith.core.draft import Draft, Drafter
from draftsmith.core.hf_cache import cache_arg
from draftsmith.core.sampling import Sampling, probs, sample
from draftsmith.core.target import Target, TargetOutput
from draftsmith.errors import DraftsmithError


def decoder_of(target: Target, what: str) -> nn.Module:
    """The target's decoder stack (``layers``, ``rotary_emb``, ``norm``), or a one-line refusal naming ``what``."""
    decoder = target.model.get_decoder()
    missing = [name for name in ("layers", "rotary_emb", "norm") if not hasattr(decoder, name)]
    config = target.config.get_text_config(decoder=True)
    if missing or config.model_type.startswith("gemma"):
        raise DraftsmithError(
            f"{what}: drafts with the target's own layers, which needs a Llama-style decoder (layers, rotary_emb, "
            f"norm, unscaled embeddings); {type(target.model).__name__} does not have that shape"
        )
    return decoder


def causal_mask(past: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, n, past + n) additive mask: n new rows after ``past`` cached ones, causal."""
    rows = torch.arange(past, past + n, device=device)[:, None]
    allowed = torch.arange(past + n, device=device)[None, :] <= rows
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[
        None, None
    ]


def crop(cache: DynamicCache, layers, length: int) -> None:
    """Crop the cache of ``layers`` back to ``length`` positions."""
    for i in layers:
        if i < len(cache.layers):
            excess = cache.layers[i].get_seq_length() - length
            if excess > 0:
                cache.layers[i].crop(-excess)


@dataclass
class SelfDraftState:
    """One sequence: committed tokens, the target's cache (shared layers) and the drafter's own caches."""

    tokens: list[int]
    cache: DynamicCache
    """The target's KV cache: every committed token but the last (the verifier's)."""
    shared: int
    own: tuple[int, ...]
    own_cache: DynamicCache
    exit_k: torch.Tensor | None = None
    exit_v: torch.Tensor | None = None


class SelfDrafter(Drafter):
    """Drafting with the target's own layers (see the module docstring).

    Args:
        shared: layers 0..shared-1 run on the target's cache.
        own: later layers run with the drafter's own cache (ascending, all >= ``shared``).
        exit: None for the target's final norm, or a module ``(hidden (1, T, H), positions (1, T), past_k, past_v,
            mask) -> (normed (1, T, H), k, v)`` with its own keys/values (Kangaroo's adapter).
        threshold: stop a draft before its first token of top-1 probability below this (0: never).
    """

    needs_features = True

    def __init__(self, shared: int, own: tuple[int, ...] = (), exit: nn.Module | None = None, threshold: float = 0.0):
        if not 0 <= threshold <= 1:
            raise DraftsmithError(f"drafter: the early-exit threshold must be in [0, 1], got {threshold}")
        self.shared, self.own, self.exit, self.threshold = shared, tuple(own), exit, threshold
        self.target: Target | None = None
        self.feature_layers = (shared,)

    def bind(self, target: Target) -> None:
        decoder = decoder_of(target, "self-drafter")
        n = len(decoder.layers)
        if not 0 <= self.shared <= n or any(not self.shared <= i < n for i in self.own):
            raise DraftsmithError(f"self-drafter: layers {self.shared} / {self.own} do not fit a {n}-layer target")
        self.target, self.decoder = target, decoder
        self.vocab_size = target.vocab_size

    def plan(self, features: tuple[torch.Tensor, ...]) -> tuple[int, tuple[int, ...]]:
        """(shared, own) for a new sequence; ``features`` are the prompt's (a layer skipper may choose from them)."""
        return self.shared, self.own

    def begin(self, tokens: torch.Tensor, target_out: TargetOutput) -> SelfDraftState:
        if self.target is None:
            raise DraftsmithError("self-drafter: drafts only inside the verifier, which binds it to its target")
        shared, own = self.plan(target_out.features)
        state = SelfDraftState(tokens.tolist(), target_out.past_key_values, shared, own, DynamicCache())
        self._catch_up(state, self._hidden(target_out, shared))
        return state

    def advance(self, state: SelfDraftState, tokens: torch.Tensor, target_out: TargetOutput) -> None:
        state.tokens.extend(tokens.tolist())
        state.cache = target_out.past_key_values
        self._catch_up(state, self._hidden(target_out, state.shared))

    def _hidden(self, target_out: TargetOutput, layer: int) -> torch.Tensor:
        """The target's hidden state after ``layer`` layers at the rows of ``target_out`` (n, H)."""
        if layer not in self.feature_layers:
            raise DraftsmithError(f"self-drafter: the verifier gave no hidden state of layer {layer}")
        return target_out.features[self.feature_layers.index(layer)]

    @torch.no_grad()
    def _catch_up(self, state: SelfDraftState, hidden: torch.Tensor) -> None:
        """Run the own layers and the exit over the rows the target just verified (their inputs: ``hidden``)."""
        if not state.own and self.exit is None:
            return
        past = len(state.tokens) - 1 - len(hidden)  # rows already cached
        h = hidden[None].to(self.target.model.dtype)
        pos = torch.arange(past, past + h.shape[1], device=h.device)[None]
        if state.own:
            pe = self.decoder.rotary_emb(h, pos)
            mask = causal_mask(past, h.shape[1], h.dtype, h.device)
            for i in state.own:
                h = self._layer(i, h, pos, pe, state.own_cache, mask)
        if self.exit is not None:
            self._exit(state, h, pos, causal_mask(past, h.shape[1], torch.float32, h.device) == 0)

    def _layer(self, i: int, h, pos, pe, cache, mask) -> torch.Tensor:
        layer = self.decoder.layers[i]
        out = layer(
            h, attention_mask=mask, position_ids=pos, **cache_arg(layer, cache), use_cache=True, position_embeddings=pe
        )
        return out[0] if isinstance(out, tuple) else out

    def _exit(self, state: SelfDraftState, h, pos, mask) -> torch.Tensor:
        out, k, v = self.exit(h.to(self.exit.norm.weight.dtype), pos, state.exit_k, state.exit_v, mask)
        state.exit_k = k if state.exit_k is None else torch.cat([state.exit_k, k], dim=2)
        state.exit_v = v if state.exit_v is None else torch.cat([state.exit_v, v], dim=2)
        return out

    def _step(self, state: SelfDraftState, token: int, position: int) -> torch.Tensor:
        """(V,) logits of the token after ``token`` at ``position``, through the drafter's layers."""
        device = self.target.device
        h = self.target.embed_tokens(torch.tensor([[token]], device=device))
        pos = torch.tensor([[position]], device=device)
        pe = self.decoder.rotary_emb(h, pos)
        for i in range(state.shared):
            h = self._layer(i, h, pos, pe, state.cache, None)
        for i in state.own:
            h = self._layer(i, h, pos, pe, state.own_cache, None)
        h = self._exit(state, h, pos, None) if self.exit is not None else self.decoder.norm(h)
        return self.target.final_logits(h)[0, -1]

    @torch.no_grad()
    def propose(self, state: SelfDraftState, k: int, sampling: Sampling, generator: torch.Generator | None) -> Draft:
        base = len(state.tokens) - 1  # committed positions in every cache
        tokens, qs, token = [], [], state.tokens[-1]
        try:
            for i in range(k):
                logits = self._step(state, token, base + i).float()
                if i and self.threshold and float(torch.softmax(logits, -1).max()) < self.threshold:
                    break
                if sampling.greedy:
                    token = int(logits.argmax())
                else:
                    qs.append(probs(logits, sampling))
                    token = sample(qs[-1], generator)
                tokens.append(token)
        finally:
            crop(state.cache, range(state.shared), base)
            crop(state.own_cache, state.own, base)
            if state.exit_k is not None:
                state.exit_k, state.exit_v = state.exit_k[:, :, :base], state.exit_v[:, :, :base]
        return Draft.chain(tokens, torch.stack(qs) if qs else None)


class LayerSkipDrafter(SelfDrafter):
    """SWIFT-style self-speculation without training: the target drafts for itself skipping a share of its layers.

    SWIFT picks the layers to skip on the fly for each input; here, at the start of each sequence, the prompt's
    hidden states rank the layers by how little they change their input (1 - cosine similarity of a layer's output
    and input, averaged over the prompt: ShortGPT's block influence), and the ``ratio`` least influential ones are
    skipped (never the first or the last). The kept layers before the first skipped one share the target's cache.

    Args:
        ratio: share of the target's layers skipped (0 drafts with the whole target).
        threshold: early exit, as ``SelfDrafter``.
    """

    def __init__(self, ratio: float = 0.5, threshold: float = 0.0) -> None:
        if not 0 <= ratio < 1:
            raise DraftsmithError(f"drafter: the share of layers to skip must be in [0, 1), got {ratio}")
        super().__init__(0, (), None, threshold)
        self.ratio = ratio

    def bind(self, target: Target) -> None:
        super().bind(target)
        n = len(self.decoder.layers)
        if self.ratio and n < 3:
            raise DraftsmithError(f"drafter skip: the target's {n} layers have no middle layer to skip")
        self.feature_layers = tuple(range(n + 1))

    def plan(self, features: tuple[torch.Tensor, ...]) -> tuple[int, tuple[int, ...]]:
        n = len(features) - 1
        skip = round(self.ratio * n)
        if skip == 0:
            return n, ()
        h = torch.stack([f.float() for f in features[:n]])  # inputs of layers 0..n-1 (the last output is normed)
        out = torch.stack([f.float() for f in features[1 : n + 1]])
        influence = 1 - torch.nn.functional.cosine_similarity(h, out, dim=-1).mean(-1)  # (n,)
        candidates = sorted(range(1, n - 1), key=lambda i: float(influence[i]))[:skip]
        first = min(candidates)
        return first, tuple(i for i in range(first, n) if i not in candidates)
