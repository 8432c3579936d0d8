"""What every exporter shares: the drafter being exported, its target, dtypes and writing files."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.core.dtypes import DTYPES, canonical_dtype, torch_dtype
from draftsmith.core.target import Target, check_fingerprint
from draftsmith.errors import DraftsmithError

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass
class Source:
    """A trained drafter to export, and the target it drafts for.

    Attributes:
        network: the drafter network (``families/<family>/network.py``).
        info: its ``native.describe()`` record: method, config, target fingerprint, version.
        path: the checkpoint or native dir it came from.
        target_dir: the target's model directory, when known.
    """

    network: torch.nn.Module
    info: dict
    path: Path
    target_dir: Path | None

    @property
    def method(self) -> str:
        return self.info["method"]

    def target_config(self, fmt: str) -> dict:
        """The target's ``config.json``; engine formats need it (layer count, architecture, name)."""
        if self.target_dir is None:
            raise DraftsmithError(
                f"--to {fmt} needs the target's model directory: {self.info['target'].get('name')!r} "
                "(recorded in the drafter) does not exist here; pass --target DIR"
            )
        config = json.loads((self.target_dir / "config.json").read_text())
        if "num_hidden_layers" not in config:  # e.g. GPT-2's n_layer / n_embd: the canonical names, as HF maps them
            from transformers import AutoConfig

            loaded = AutoConfig.from_pretrained(self.target_dir)
            for name in ("num_hidden_layers", "hidden_size", "vocab_size"):
                config.setdefault(name, getattr(loaded, name))
        return config


def target_fingerprint(path: Path, dtype: str = "float32") -> dict:
    """``Target.fingerprint`` of a model directory in ``dtype`` without loading its weights (the model is built on
    the meta device: the fingerprint reads only its config, output-embedding shape and tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    return Target(model, AutoTokenizer.from_pretrained(path), name=str(path), batch_invariant=False).fingerprint


def load_source(path: str | Path, target: str | Path | None = None) -> Source:
    """Load a drafter from a ``.ckpt`` or native dir; check it against ``target`` (default: the target
    it records, when that directory exists)."""
    from draftsmith.core.native import is_deepspeed, is_native
    from draftsmith.families.registry import load_network
    from draftsmith.targets import resolve

    path = Path(path)
    if not path.exists():
        raise DraftsmithError(f"export: {path} does not exist")
    if not (path.is_file() or is_native(path) or is_deepspeed(path)):
        raise DraftsmithError(f"export: {path} is neither a Lightning checkpoint nor a draftsmith native dir")
    network, info = load_network(path)
    recorded = info["target"].get("name") or ""
    target_dir = resolve(target) if target is not None else (Path(recorded) if recorded else None)
    if target_dir is not None and not (target_dir / "config.json").is_file():
        if target is not None:
            raise DraftsmithError(f"--target {target}: not a model directory (no config.json)")
        target_dir = None
    if target_dir is not None:
        # an engine serves the target in its own dtype: the drafter's identity is checked, not its training dtype
        made = info["target"].get("dtype", "float32")
        check_fingerprint(info["target"], target_fingerprint(target_dir, made), f"drafter {str(path)!r}")
    return Source(network.eval(), info, path, target_dir)


def cast(tensors: dict[str, torch.Tensor], dtype: str | None) -> dict[str, torch.Tensor]:
    """Floating-point tensors to ``dtype`` (None keeps them); integer/bool maps (d2t, t2d) stay exact."""
    dtype = canonical_dtype(dtype) if dtype is not None else None
    out = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(DTYPES[dtype])
        out[name] = t.contiguous()
    return out


def dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    """The HF ``torch_dtype`` string of the floating tensors."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return DTYPE_NAMES[kinds.pop()] if len(kinds) == 1 else "float32"


def write(out: Path, tensors: dict[str, torch.Tensor], config: dict, fmt: str) -> Path:
    """``model.safetensors`` + ``config.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt", "draftsmith_export": fmt})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
