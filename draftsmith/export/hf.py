"""Hugging Face export: a distilled draft LM as a plain causal-LM directory + the target's tokenizer.

The result loads with ``AutoModelForCausalLM.from_pretrained``; it serves as a ``transformers``
assistant model (``generate(..., assistant_model=...)``) and as vLLM's ``"method": "draft_model"``
when its vocabulary is the target's. A LoRA adapter is merged into the weights (peft ``merge_and_unload``).

Inputs: a trained drafter whose family has an ``hf`` hook (``families/<family>/export.py``, ``hook(src) ->
PreTrainedModel``: the draft LM's), or any HF causal-LM directory, optionally a peft adapter dir
(``adapter_config.json``).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from draftsmith.core.fingerprint import tokenizer_hash
from draftsmith.errors import DraftsmithError
from draftsmith.export.common import DTYPES, Source, target_fingerprint
from draftsmith.export.serve import DEFAULTS, Serving, draft_model_config, vllm_command
from draftsmith.families.registry import export_hook


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model or peft adapter directory (not a draftsmith native one)."""
    from draftsmith.core.native import is_native

    return (
        path.is_dir()
        and not is_native(path)
        and any((path / f).is_file() for f in ("config.json", "adapter_config.json"))
    )


def load_hf_dir(path: Path) -> PreTrainedModel:
    """The causal LM in ``path``, with a peft adapter merged in when ``path`` holds one."""
    if (path / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(path).merge_and_unload()
    return AutoModelForCausalLM.from_pretrained(path)


def _save(
    model: PreTrainedModel, tokenizer, out: Path, dtype: str | None, target_dir: Path | None, serving: Serving
) -> str:
    if target_dir is not None:
        fp = target_fingerprint(target_dir)
        vocab = model.get_output_embeddings().weight.shape[0]
        if vocab != fp["vocab_size"] or tokenizer_hash(tokenizer) != fp["tokenizer_hash"]:
            raise DraftsmithError(
                f"the draft LM's vocabulary ({vocab} tokens) or tokenizer differs from target {str(target_dir)!r}'s "
                f"({fp['vocab_size']}): engines need the same vocabulary to verify its drafts"
            )
    if dtype:
        model = model.to(DTYPES[dtype])
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    spec = draft_model_config(out, serving.k or 4)
    return vllm_command(target_dir or "TARGET", spec, serving.dtype)


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """A trained draft LM (its tokenizer is the target's); returns the ``vllm serve`` command at ``serving``."""
    model = export_hook(src.method, "hf")(src)
    if src.target_dir is None:
        raise DraftsmithError("--to hf needs the target's tokenizer: pass --target DIR")
    return _save(model, AutoTokenizer.from_pretrained(src.target_dir), out, dtype, src.target_dir, serving)


def export_dir(path: Path, out: Path, dtype: str | None, target_dir: Path | None, serving: Serving = DEFAULTS) -> str:
    """An HF causal-LM (or adapter) directory; the tokenizer is its own, else the target's."""
    model = load_hf_dir(path)
    tok_dir = path if (path / "tokenizer_config.json").is_file() else target_dir
    if tok_dir is None:
        raise DraftsmithError(f"{path} has no tokenizer: pass --target DIR to take the target's")
    return _save(model, AutoTokenizer.from_pretrained(tok_dir), out, dtype, target_dir, serving)
