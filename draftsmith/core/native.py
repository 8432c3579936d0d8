"""draftsmith's own drafter format: what a native directory or a ``DrafterModule`` checkpoint records.

A trained drafter is a ``method`` name, the config dataclass of its network, its
weights and the fingerprint of the target it was trained for. A native directory
holds them as ``config.json`` + ``model.safetensors``; a Lightning checkpoint of
a ``DrafterModule`` holds them under ``checkpoint["draftsmith"]`` and the
``drafter.*`` entries of its state dict. Rebuilding a network from a record is the
families' registry's job (``draftsmith.families.registry``).
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import draftsmith
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError

FORMAT = "draftsmith.drafter/1"


def describe(model: torch.nn.Module, target: Target) -> dict:
    """What a checkpoint or native dir records beside the weights."""
    return {
        "format": FORMAT,
        "method": model.method,
        "config": asdict(model.cfg),
        "target": target.fingerprint,
        "draftsmith_version": draftsmith.__version__,
    }


def save_native(model: torch.nn.Module, target: Target, out: str | Path, extra: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``model`` (a drafter network: ``method``, ``cfg`` and
    ``for_export()``, which a LoRA-trained draft LM uses to write its merged weights)."""
    model = model.for_export()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # a copy per key: tied weights (a draft LM's embeddings and LM head) share storage, which safetensors refuses
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    save_file(state, out / "model.safetensors", metadata={"format": FORMAT})
    (out / "config.json").write_text(json.dumps({**describe(model, target), **(extra or {})}, indent=2) + "\n")
    return out


def _read_native(path: Path) -> tuple[dict, dict]:
    try:
        info = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise DraftsmithError(f"{path / 'config.json'} is not valid JSON ({e.msg})") from None
    try:
        return info, load_file(path / "model.safetensors")
    except SafetensorError as e:
        raise DraftsmithError(
            f"{path / 'model.safetensors'}: cannot read the weights (truncated or corrupt: {e})"
        ) from None


def _read_checkpoint(path: Path) -> tuple[dict, dict]:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, EOFError, OSError, RuntimeError, ValueError) as e:  # torch's zip reader's errors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DraftsmithError(f"{path}: cannot read the checkpoint (truncated or corrupt: {reason})") from None
    return _record(path, checkpoint)


def _read_deepspeed(path: Path) -> tuple[dict, dict]:
    """A ZeRO checkpoint (stage 2 or 3, its weights sharded or not) gathered into one float32 state on the CPU."""
    if importlib.util.find_spec("deepspeed") is None:
        raise DraftsmithError(f"{path}: a DeepSpeed checkpoint; reading it needs `pip install deepspeed`")
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    with tempfile.TemporaryDirectory() as tmp:
        return _record(path, convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "gathered.pt"))


def _record(path: Path, ckpt: dict) -> tuple[dict, dict]:
    if "draftsmith" not in ckpt:
        raise DraftsmithError(f"{path}: not a checkpoint of a draftsmith DrafterModule (no 'draftsmith' entry)")
    state = {k.removeprefix("drafter."): v for k, v in ckpt["state_dict"].items() if k.startswith("drafter.")}
    return ckpt["draftsmith"], state


def read(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The record and weights of a native dir or a ``.ckpt`` (a file, or the directory DeepSpeed saves)."""
    path = Path(path)
    if path.is_file():
        return _read_checkpoint(path)
    return _read_deepspeed(path) if is_deepspeed(path) else _read_native(path)


def is_deepspeed(path: Path) -> bool:
    """Whether ``path`` is a checkpoint Lightning's ``DeepSpeedStrategy`` saved: a directory with a ``latest`` tag."""
    return (path / "latest").is_file()


def is_native(path: Path) -> bool:
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        return False
    try:
        return json.loads((path / "config.json").read_text()).get("format") == FORMAT
    except json.JSONDecodeError:
        return False
