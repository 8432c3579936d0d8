"""What every exporter shares: the drafter being exported, loaded and checked against its target (``Source``, with
casting and writing files, sits below the families in ``layers/export.py``, so that their export hooks use it too)."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.core.dtypes import DTYPES, torch_dtype
from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.layers.export import Source

__all__ = ["DTYPES", "Source", "load_source", "target_fingerprint"]


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
