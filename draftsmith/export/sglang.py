"""SGLang drafter directories: EAGLE-1 and EAGLE-3, as SGLang's loaders read them.

Facts, read in sgl-project/sglang ``python/sglang/srt`` (main branch, 2026; no SGLang runs on this CPU,
so the test suite checks the files against these facts, and serves the EAGLE-3 dir in vLLM 0.32,
which reads the same layout):
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
  ``models/llama.py::set_eagle3_layers_to_capture`` captures ``id + 1`` (``eagle_layout.aux_layer_ids``).
  The same dir carries the ids in vLLM numbering at the top level, which vLLM reads first and SGLang
  ignores, so it loads correctly in both.
- ``models/llama_eagle.py``: ``LlamaForCausalLMEagle``; ``fc`` is ``nn.Linear(2H, H)`` *with* a bias
  (a missing ``fc.bias`` keeps its random init); layer 0 has no ``input_layernorm``; embedding and
  LM head are replaced by the target's (``eagle_worker.py``: ``set_embed_and_head``).
- DFlash (``--speculative-algorithm DFLASH``, ``--speculative-dflash-block-size``; z-lab's collaboration with
  LMSYS, 2026): z-lab's ``DFlashDraftModel`` layout, the one vLLM also reads (``vllm.dflash_dir``), with the masks
  embedded as ``dflash_config.mask_token_id``: only a drafter trained so (``model.mask_from_token: true``) is
  written. SpecForge's ``DFlashDraftModel`` (which trains drafters for SGLang) loads the dir and computes draftsmith's
  logits (tests/test_peers.py).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.export import eagle_layout
from draftsmith.export.common import Source, cast, dtype_name, write
from draftsmith.export.serve import DEFAULTS, Serving
from draftsmith.export.vllm import dflash_dir, eagle3_config, eagle3_tensors, norm_flags

METHODS = ("eagle1", "eagle3", "dflash")


def _eagle3(src: Source, out: Path, dtype: str | None) -> str:
    if any(norm_flags(src.network.cfg).values()):
        on = ", ".join(k for k, v in norm_flags(src.network.cfg).items() if v)
        raise DraftsmithError(
            f"--to sglang: an EAGLE-3 with {on}; SGLang's EAGLE-3 reads no feature norms nor a normed residual, and "
            "SpecForge's norm_output means another thing: export it --to vllm or --to speculators"
        )
    if src.network.cfg.num_layers > 1:
        raise DraftsmithError(
            f"--to sglang: a {src.network.cfg.num_layers}-layer EAGLE-3; SGLang's LlamaForCausalLMEagle3 holds one "
            "decoder layer (midlayer.*): export it --to vllm"
        )
    target = src.target_config("sglang")
    layers = target["num_hidden_layers"]
    sglang_ids = eagle_layout.aux_layer_ids(src.network.cfg, layers, "sglang")
    vllm_ids = eagle_layout.aux_layer_ids(src.network.cfg, layers, "vllm")
    tensors = cast(eagle3_tensors(src.network, eagle_layout.LAYOUTS["sglang"].prefix), dtype)
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
    return "EAGLE3"


def _eagle1(src: Source, out: Path, dtype: str | None) -> str:
    network = src.network
    target = src.target_config("sglang")
    eagle_layout.check_eagle1_feature(network.cfg, target["num_hidden_layers"], "SGLang")
    state = network.state_dict()
    tensors = cast(
        {
            "fc.weight": state["fc.weight"],
            "fc.bias": state["fc.bias"],
            **eagle_layout.layer_tensors(network, eagle_layout.EAGLE1_PREFIX),
        },
        dtype,
    )
    config = {
        "architectures": ["LlamaForCausalLMEagle"],
        **eagle_layout.llama_config(network.cfg, target, network.cfg.vocab_size),
        "torch_dtype": dtype_name(tensors),
    }
    write(out, tensors, config, "sglang")
    return "EAGLE"


def _dflash(src: Source, out: Path, dtype: str | None) -> str:
    if not src.network.cfg.mask_from_token:
        raise DraftsmithError(
            "SGLang's and SpecForge's DFlash embed the masks as the target's embedding of mask_token_id; this drafter "
            "learned its own mask embedding: train it with model.mask_from_token: true to export here (vLLM's layout, "
            "--to vllm, carries a learned one)"
        )
    dflash_dir(src, out, dtype, src.target_config("sglang"), "sglang")
    return "DFLASH"


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the SGLang drafter dir; return the ``sglang.launch_server`` command (a chain of ``serving.k`` tokens,
    default 4, with the target in ``serving.dtype``)."""
    server = f"python -m sglang.launch_server --model-path {src.target_dir}"
    server += f" --dtype {serving.dtype}" if serving.dtype else ""
    if src.method == "dflash":
        _dflash(src, out, dtype)
        return (
            f"{server} --speculative-algorithm DFLASH --speculative-draft-model-path {out} "
            f"--speculative-dflash-block-size {src.network.cfg.depth + 1}"
        )
    algorithm = {"eagle3": _eagle3, "eagle1": _eagle1}[src.method](src, out, dtype)
    k = serving.k or 4
    return (
        f"{server} --speculative-algorithm {algorithm} --speculative-draft-model-path {out} "
        f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
    )
