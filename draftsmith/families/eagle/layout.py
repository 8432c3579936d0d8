"""EAGLE-1 / EAGLE-3 networks as serving engines lay them out: tensor names and aux layer ids (the decoder layer's
Llama config is ``layers.export.llama_config``).

draftsmith's ``EagleModel`` (``families/eagle/network.py``) names its decoder layer ``layer.*``; engines name it
``layers.0.*`` (vLLM, speculators) or ``midlayer.*`` (SGLang EAGLE-3). Its ``feature_layers`` are HF
``hidden_states`` indices (0 = embeddings, L = the final *normed* state); each engine numbers the
states it can capture its own way. ``LAYOUTS`` is the one table of these facts: the family's export hooks
(``export.py``) write by it and ``draftsmith import`` reads by it (through ``draftsmith.export.eagle_layout``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.layers.export import AuxIds

VLLM_IDS = AuxIds(("eagle_aux_hidden_state_layer_ids",), 0)
"""vLLM's and speculators' EAGLE-3 ids, top-level: id k is the residual stream entering layer k (``aux_layer_ids``)."""
SGLANG_IDS = AuxIds(("eagle_config", "eagle_aux_hidden_state_layer_ids"), 1)
"""SGLang's (and SpecForge's, the EAGLE release's) EAGLE-3 ids, under ``eagle_config``: SGLang captures id + 1."""


@dataclass(frozen=True)
class EagleLayout:
    """How one engine or library lays out an EAGLE-3 (and P-EAGLE) drafter."""

    name: str
    prefix: str
    """The one decoder layer's tensor names start with this."""
    aux_ids: tuple[AuxIds, ...]
    """Where its aux layer ids are, the first present wins; an export writes the first."""
    layer_config: str | None = None
    """The config key holding the decoder layer's Llama config (None: the config's top level)."""


LAYOUTS = {
    "speculators": EagleLayout("speculators", "layers.0.", (VLLM_IDS,), "transformer_layer_config"),
    "sglang": EagleLayout("sglang", "midlayer.", (SGLANG_IDS, VLLM_IDS)),
    "specforge": EagleLayout("specforge", "layers.0.", (VLLM_IDS, SGLANG_IDS)),  # SpecForge's PEagleDraftModel
    "vllm": EagleLayout("vllm", "layers.0.", (VLLM_IDS,)),
}
"""EAGLE-3 layouts by name: speculators (vllm-project/speculators), sglang (SGLang's ``LlamaForCausalLMEagle3``, which
SpecForge writes and the EAGLE repository released), specforge (SpecForge's P-EAGLE), vllm
(``Eagle3LlamaForCausalLM``)."""
EAGLE3_NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")
"""EAGLE-3's norm flags beyond SGLang's layer (``Eagle3Config`` fields), named as vLLM and speculators read them:
EAGLE-3.1's three and speculators' residual norm; SGLang/SpecForge's ``norm_output`` means another thing and their
EAGLE-3 has no ``norm_before_residual``."""
EAGLE1_PREFIX = "layers.0."
"""EAGLE-1's decoder layer in every engine (vLLM's ``EagleLlamaForCausalLM``, SGLang's ``LlamaForCausalLMEagle``)."""


def loader_default_layers(num_layers: int) -> tuple[int, int, int]:
    """The HF ``hidden_states`` every EAGLE-3 loader captures when a config names no aux ids (low, middle, high)."""
    return (2, num_layers // 2, num_layers - 3)


def feature_layers(config: dict, layout: str, num_layers: int) -> tuple[int, ...]:
    """The HF ``hidden_states`` indices an EAGLE-3 checkpoint in ``layout`` was trained on."""
    for numbering in LAYOUTS[layout].aux_ids:
        layers = numbering.read(config)
        if layers is not None:
            return layers
    return loader_default_layers(num_layers)


def layer_tensors(network: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """The decoder layers' tensors: ``layer.X`` -> ``{prefix}X``; an EAGLE-3 of ``num_layers`` > 1 also
    ``more_layers.i.X`` -> ``layers.{i + 1}.X``, as vLLM numbers its stack (``prefix`` must then be ``layers.0.``)."""
    state = network.state_dict()
    out = {prefix + k.removeprefix("layer."): v for k, v in state.items() if k.startswith("layer.")}
    more = {k: v for k, v in state.items() if k.startswith("more_layers.")}
    if more and prefix != "layers.0.":
        raise DraftsmithError(f"a {network.cfg.num_layers}-layer EAGLE-3 has no {prefix}* layout (one layer)")
    for name, value in more.items():
        _, i, rest = name.split(".", 2)
        out[f"layers.{int(i) + 1}.{rest}"] = value
    return out


def read_layer_tensors(state: dict[str, torch.Tensor], prefix: str, where: str) -> dict[str, torch.Tensor]:
    """The inverse of ``layer_tensors``: ``{prefix}X`` -> ``layer.X`` and a stack's ``layers.{i}.X`` ->
    ``more_layers.{i - 1}.X`` (vLLM builds a ``hidden_norm`` in every layer and uses only layer 0's: those of the
    later layers are dropped). A stack must be numbered ``layers.0, layers.1, ...`` (one line names the gap)."""
    more = stack_indices(state)
    if more and (prefix != "layers.0." or more != list(range(1, len(more) + 1))):
        raise DraftsmithError(
            f"{where}: decoder layers {', '.join(f'layers.{i}' for i in more)} beside {prefix}*; draftsmith imports "
            "an EAGLE-3 stack numbered layers.0, layers.1, ... (vLLM's and speculators' layout): not imported"
        )
    out = {"layer." + k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    for name, value in state.items():
        if name.startswith("layers.") and not name.startswith("layers.0."):
            _, i, rest = name.split(".", 2)
            if not rest.startswith("hidden_norm."):
                out[f"more_layers.{int(i) - 1}.{rest}"] = value
    return out


def stack_indices(state: dict[str, torch.Tensor]) -> list[int]:
    """The decoder layers after ``layers.0`` a checkpoint holds (``layers.{i}.*``, i > 0), in order."""
    return sorted({int(k.split(".")[1]) for k in state if k.startswith("layers.") and not k.startswith("layers.0.")})


def check_eagle1_feature(cfg, num_layers: int, engine: str) -> None:
    """EAGLE-1 engines feed the target's final normed hidden state (HF ``hidden_states[L]``)."""
    if tuple(cfg.feature_layers) != (num_layers,):
        raise DraftsmithError(
            f"{engine} feeds EAGLE-1 the target's final normed hidden state (HF hidden_states[{num_layers}]); "
            f"this drafter was trained on feature_layers={list(cfg.feature_layers)}"
        )


def aux_layer_ids(cfg, num_layers: int, engine: str) -> list[int]:
    """EAGLE-3 feature layers (HF ``hidden_states`` indices) as ``engine`` (a ``LAYOUTS`` name) numbers its aux
    layers.

    vLLM 0.32 (``model_executor/models/llama.py`` + ``interfaces.py::_maybe_add_hidden_state``): id k is
    the residual stream entering layer k (k = L: leaving the last layer, *before* the final norm), so
    id k = HF ``hidden_states[k]`` for k < L. SGLang (``models/llama.py::set_eagle3_layers_to_capture``)
    captures ``val + 1`` for an explicit id, so id k = HF ``hidden_states[k + 1]``. Neither captures
    HF ``hidden_states[L]`` (normed). Both size ``fc`` by ``num_aux_hidden_states``, else by the count of the ids
    under ``eagle_config``, else three (``eval.doctor.engine_reads.AUX_COUNT``); the exports write three only.
    """
    layers = list(cfg.feature_layers)
    if len(layers) != 3:
        raise DraftsmithError(
            f"the {engine} export writes EAGLE-3 over 3 target layers (fc [H, 3*Ht]); this drafter uses {layers}"
        )
    if len(set(layers)) != 3:
        raise DraftsmithError(f"{engine} captures each aux layer once; this drafter repeats one in {layers}")
    numbering = LAYOUTS[engine].aux_ids[0]
    lowest = numbering.offset
    bad = [k for k in layers if not lowest <= k < num_layers]
    if bad:
        raise DraftsmithError(
            f"{engine} cannot feed EAGLE-3 HF hidden_states{bad} of a {num_layers}-layer target (it captures "
            f"{lowest}..{num_layers - 1}; {num_layers} is the final *normed* state, which no engine exposes): "
            f"retrain with e.g. --model.init_args.feature_layers '[{max(1, num_layers - 3)}, "
            f"{max(1, num_layers - 2)}, {num_layers - 1}]'"
        )
    return numbering.ids(layers)


def vocab_maps(network: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` of an EAGLE-3 drafter, checked: draft id i is target id i + d2t[i], ascending,
    inside the target vocabulary, and exactly the ids ``t2d`` marks."""
    d2t, t2d = network.d2t.detach().cpu().long(), network.t2d.detach().cpu().bool()
    ids = torch.arange(len(d2t)) + d2t  # (Vd,)
    ok = bool((ids[1:] > ids[:-1]).all()) and int(ids.min()) >= 0 and int(ids.max()) < len(t2d)
    if not ok or int(t2d.sum()) != len(d2t) or not bool(t2d[ids.clamp(0, len(t2d) - 1)].all()):
        raise DraftsmithError("drafter's d2t/t2d maps are inconsistent (draft ids must map ascending into t2d)")
    return d2t, t2d


def fold_fc_bias(network: torch.nn.Module, rtol: float = 1e-4) -> torch.Tensor:
    """EAGLE-1's embedding with ``fc.bias`` folded in, for a loader whose fc has no bias.

    fc(concat(e, f)) + b = W_e (e + c) + W_f f with W_e c = b: adding c to every embedding row is the
    same network. Returns the new (V, H) embedding; refuses when W_e cannot reproduce b.
    """
    w = network.fc.weight.detach().double()  # (H, 2H): [W_e | W_f], input order concat(embeds, hidden)
    b = network.fc.bias.detach().double()  # (H,)
    h = network.cfg.shape.hidden_size
    c = torch.linalg.lstsq(w[:, :h], b[:, None]).solution[:, 0]  # (H,)
    err = float((w[:, :h] @ c - b).norm() / b.norm().clamp_min(1e-30))
    if err > rtol:
        raise DraftsmithError(
            f"cannot fold EAGLE-1's fc.bias into the embedding (relative residual {err:.2e} > {rtol}); "
            "this engine's EAGLE-1 fc has no bias and would drop it silently"
        )
    return (network.embed_tokens.weight.detach().double() + c).to(network.embed_tokens.weight.dtype)
