"""P-EAGLE's blocks for the export formats it has (vLLM, speculators): EAGLE-3's (``families/eagle/export.py``) plus
``mask_hidden``, the placeholder's stand-in for the target features, and the placeholder token.

- vLLM 0.32: EAGLE-3 (``llama_eagle3.py``) with ``parallel_drafting`` (``v1/spec_decode/llm_base_proposer.py``,
  ``utils.py::_copy_and_expand_eagle_inputs``: the placeholder, ``pard_token``, is an ordinary token id below the
  target's ``vocab_size``, appended K-1 times after the step's tokens at consecutive positions); placeholders pair
  ``embed[pard_token]`` with ``fc(mask_hidden)``, ``mask_hidden`` of the concatenated feature width (required, else a
  load error). The same dir is SpecForge's P-EAGLE layout (``PEagleDraftModel.from_pretrained`` loads it and computes
  draftsmith's logits, tests/test_peers.py): ``mask_hidden`` (1, 1, 3*Ht), ``mask_token_id``, ``num_depths`` and
  ``eagle_config`` (its capture layers, SGLang numbering) written beside vLLM's keys.
- speculators (``speculators_model_type: peagle``, speculators 0.9.0 ``models/peagle``: ``PEagleSpeculatorConfig``
  is EAGLE-3's with ``mask_token_id``; ``PEagleDraftModel`` adds ``mask_hidden`` (1, 1, aux x H) before ``fc``).
  vLLM 0.32 (``algos.py::update_peagle``) serves it as EAGLE-3 with ``parallel_drafting``, ``pard_token`` =
  ``mask_token_id``.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.families.eagle import layout
from draftsmith.families.eagle.export import eagle3_config, eagle3_tensors, speculators_dir
from draftsmith.families.registry import exports
from draftsmith.layers.export import Source, cast, dtype_name, write


@exports("vllm", "peagle")
def vllm_peagle(src: Source, out: Path, dtype: str | None) -> dict:
    network = src.network
    target = src.target_config("vllm")
    aux = layout.aux_layer_ids(network.cfg, target["num_hidden_layers"], "vllm")
    mask_hidden = network.state_dict()["mask_hidden"].reshape(1, 1, -1)  # SpecForge's shape; vLLM views it (1, -1)
    tensors = cast({**eagle3_tensors(network, layout.LAYOUTS["vllm"].prefix), "mask_hidden": mask_hidden}, dtype)
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
            "eagle_aux_hidden_state_layer_ids": layout.aux_layer_ids(network.cfg, layers, "sglang"),
            "use_aux_hidden_state": True,
        },
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "vllm")
    spec = {"method": "eagle3", "model": str(out), "num_speculative_tokens": network.cfg.depth}
    return spec | {"parallel_drafting": True}


@exports("speculators", "peagle")
def speculators_peagle(src: Source, out: Path, dtype: str | None, k: int | None) -> None:
    cfg = src.network.cfg
    mask_hidden = src.network.state_dict()["mask_hidden"].reshape(1, 1, -1)
    speculative_tokens = min(k or cfg.depth, cfg.depth)  # one forward drafts at most its depth
    more_config = {"mask_token_id": cfg.mask_token_id}
    speculators_dir(src, out, dtype, speculative_tokens, "PEagleDraftModel", {"mask_hidden": mask_hidden}, more_config)
