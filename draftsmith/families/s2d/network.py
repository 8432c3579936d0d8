"""Sorted draft LM (S2D): one draft LM whose nested sub-networks, its first n decoder layers sharing its embeddings,
final norm and LM head, each draft as an ordinary draft LM.

S2D (Kavehzadeh et al. 2024, "S2D: Sorted Speculative Decoding For More Efficient Deployment of Nested Large Language
Models", arXiv:2407.01955) trains such a draft with Sorted Fine-Tuning (SoFT; Sorted LLaMA, arXiv:2309.08968) and
serves several targets of one family with it, each by the sub-network that suits it, instead of one drafter per
target. ``S2DNetwork`` is the trainable draft (every sub-network's logits from one forward,
``exit_logits``); ``subnetwork(n)`` is sub-network n as an ordinary ``draft_lm`` network (what exports write);
``S2DDrafter`` is the verifier's drafter, drafting with one sub-network at a time (``use``), the one
``families.s2d.exits.choose_exits`` picks for the target being scored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from draftsmith.core.draft import DecodeResult, DrafterNetwork
from draftsmith.core.target import compiled_forward
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import register
from draftsmith.layers.causal_lm import DraftLM, DraftLMConfig, DraftLMNetwork


def check_exits(exits: Iterable[int], layers: int, where: str) -> tuple[int, ...]:
    """``exits`` sorted, each a sub-network depth in 1..``layers``, the deepest the whole draft (else one line
    naming ``where``)."""
    out = tuple(sorted(set(int(n) for n in exits)))
    if not out or out[0] < 1 or out[-1] != layers:
        raise DraftsmithError(
            f"{where}: exits {list(exits)} must be layer counts in 1..{layers}, the deepest {layers} (the whole draft)"
        )
    return out


def decoder_parts(model: PreTrainedModel) -> tuple[torch.nn.ModuleList, torch.nn.Module]:
    """The causal LM's decoder layers and final norm (what each sub-network's exit reads), refused in one line for
    an architecture without them."""
    decoder = model.get_decoder()
    layers, norm = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
    if not isinstance(layers, torch.nn.ModuleList) or norm is None:
        raise DraftsmithError(
            f"sorted draft LM: a {type(model).__name__} has no decoder `layers` and final `norm` (Llama-like causal "
            "LMs have): its sub-networks cannot be cut from it"
        )
    return layers, norm


def truncated(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A copy of causal LM ``model`` cut to its first ``layers`` decoder layers, its embeddings, final norm and LM
    head kept: sub-network ``layers`` as a model of its own (in eval mode, on ``model``'s device and dtype)."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    sub = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, _ = sub.load_state_dict(model.state_dict(), strict=False)  # the deeper layers' weights are left out
    if missing:
        raise DraftsmithError(f"sorted draft LM: sub-network {layers} misses weights {missing[:3]}")
    return sub.to(model.device).eval()


@dataclass
class S2DConfig:
    """A trained sorted draft LM: its Hugging Face config and its sub-networks' depths."""

    hf_config: dict = field(default_factory=dict)
    """``PretrainedConfig.to_dict()`` of the whole draft (``model_type`` selects the architecture)."""
    exits: tuple[int, ...] = ()
    """Decoder layers of each sub-network, shallowest first; the deepest is the whole draft."""


@register("s2d", config=S2DConfig)
class S2DNetwork(DrafterNetwork):
    """The trainable sorted draft LM: an HF causal LM whose first-n-layer sub-networks (n in ``cfg.exits``) share
    its final norm and LM head.

    Args:
        cfg: the HF config and the sub-networks' depths.
        model: an already built model for ``cfg.hf_config``; None builds a freshly initialised one.
    """

    method = "s2d"

    def __init__(self, cfg: S2DConfig, model: PreTrainedModel | None = None) -> None:
        super().__init__()
        if model is None:
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg.hf_config))
        decoder_parts(model)
        self.exits = check_exits(cfg.exits, model.config.num_hidden_layers, "model.exits")
        self.cfg = S2DConfig(cfg.hf_config, self.exits)
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) next-token logits of the whole draft (its deepest sub-network)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def exit_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[int, torch.Tensor]:
        """(B, T) ids -> each sub-network's (B, T, V) next-token logits, from one forward of the whole draft:
        sub-network n's are the shared final norm and LM head on layer n's output (what ``truncated(model, n)``
        computes)."""
        layers, norm = decoder_parts(self.model)
        states: dict[int, torch.Tensor] = {}

        def keep(n: int):
            def hook(module, args, output) -> None:
                states[n] = output[0] if isinstance(output, tuple) else output  # (B, T, H)

            return hook

        hooks = [layers[n - 1].register_forward_hook(keep(n)) for n in self.exits]
        try:
            self.model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        head = self.model.get_output_embeddings()
        return {n: head(norm(states[n])) for n in self.exits}

    def subnetwork(self, layers: int) -> DraftLMNetwork:
        """Sub-network ``layers`` as an ordinary draft LM network (its own copy of the weights)."""
        if layers not in self.exits:
            raise DraftsmithError(
                f"--depth {layers}: the sorted draft LM's sub-networks have {list(self.exits)} layers"
            )
        model = truncated(self.model, layers)
        return DraftLMNetwork(DraftLMConfig(json.loads(model.config.to_json_string(use_diff=False)), None), model)

    @property
    def output_size(self) -> int:
        return self.model.config.hidden_size

    def as_drafter(self, topk_accuracy: list | None = None) -> S2DDrafter:
        """The verifier's drafter over every sub-network (``topk_accuracy`` is unused: draft LMs draft chains)."""
        deepest = self.exits[-1]
        return S2DDrafter({n: self.model if n == deepest else truncated(self.model, n) for n in self.exits})


class S2DDrafter(DraftLM):
    """A sorted draft LM as the verifier's drafter: an ordinary draft LM over one of its sub-networks at a time
    (the deepest until ``use`` picks another; ``score`` picks one per target, ``families.s2d.exits.choose_exits``).

    Args:
        subnetworks: depth -> the causal LM of the draft's first that many layers.
        tokenizer: the draft's tokenizer, checked against the target's.
        stop_below: as ``DraftLM``'s.
    """

    def __init__(self, subnetworks: dict[int, PreTrainedModel], tokenizer=None, stop_below: float = 0.0) -> None:
        self.subnetworks = dict(sorted(subnetworks.items()))
        self.compiled = False
        self.choice: dict | None = None
        """How ``families.s2d.exits.choose_exits`` chose the sub-network for the target being scored (the row's ``s2d``)."""
        super().__init__(self.subnetworks[max(self.subnetworks)], tokenizer, stop_below)
        self.layers = max(self.subnetworks)
        """The depth of the sub-network that drafts."""

    def use(self, layers: int) -> None:
        """Draft with sub-network ``layers`` from the next prompt on (each ``begin`` starts a new cache)."""
        if layers not in self.subnetworks:
            raise DraftsmithError(
                f"sorted draft LM: no sub-network of {layers} layers (it has {list(self.subnetworks)})"
            )
        self.model, self.layers = self.subnetworks[layers].eval(), layers
        self._forward = compiled_forward(self.model) if self.compiled else self.model.__call__

    def compile(self) -> None:
        self.compiled = True
        self.use(self.layers)

    def extra_metrics(self, results: list[DecodeResult]) -> dict:
        return {"s2d": self.choice} if self.choice is not None else {}
