"""The draft LM's block for the export format it has (``hf``): its causal LM, a LoRA adapter merged in, which
``transformers`` loads as an assistant model and vLLM serves as ``"method": "draft_model"``."""

from __future__ import annotations

from transformers import PreTrainedModel

from draftsmith.families.registry import exports
from draftsmith.layers.export import Source


@exports("hf", "draft_lm")
def hf_draft_lm(src: Source) -> PreTrainedModel:
    return src.network.for_export().model
