"""draftsmith's own drafter format, and loading trained drafters from it or from Lightning checkpoints.

A trained drafter is a ``method`` name, the config dataclass of its network, its
weights and the fingerprint of the target it was trained for. A native directory
holds them as ``config.json`` + ``model.safetensors``; a Lightning checkpoint of
a ``DrafterModule`` holds them under ``checkpoint["draftsmith"]`` and the
``drafter.*`` entries of its state dict.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import draftsmith
from draftsmith.errors import DraftsmithError
from draftsmith.models.base import Drafter
from draftsmith.target import Target, check_fingerprint

FORMAT = "draftsmith.drafter/1"


def _families() -> dict:
    """method -> (config dataclass, network class). Imported lazily: each family is its own module."""
    from draftsmith.models.acceptance_head import AcceptanceHead, AcceptanceHeadConfig
    from draftsmith.models.draft_lm import DraftLMConfig, DraftLMNetwork
    from draftsmith.models.eagle import EagleConfig, EagleModel
    from draftsmith.models.hydra import HydraConfig, HydraModel
    from draftsmith.models.medusa import MedusaConfig, MedusaModel

    return {
        "eagle1": (EagleConfig, EagleModel),
        "eagle3": (EagleConfig, EagleModel),
        "medusa1": (MedusaConfig, MedusaModel),
        "medusa2": (MedusaConfig, MedusaModel),
        "hydra": (HydraConfig, HydraModel),
        "hydrapp": (HydraConfig, HydraModel),
        "draft_lm": (DraftLMConfig, DraftLMNetwork),
        "acceptance_head": (AcceptanceHeadConfig, AcceptanceHead),
    }


def describe(model: torch.nn.Module, target: Target) -> dict:
    """What a checkpoint or native dir records beside the weights."""
    return {
        "format": FORMAT,
        "method": model.method,
        "config": asdict(model.cfg),
        "target": target.fingerprint,
        "draftsmith_version": draftsmith.__version__,
    }


def build(info: dict, state: dict[str, torch.Tensor], where: str) -> torch.nn.Module:
    """Rebuild a drafter network from ``describe()``'s record and its weights."""
    families = _families()
    method = info.get("method")
    if method not in families:
        raise DraftsmithError(f"{where}: unknown drafter method {method!r} (known: {', '.join(sorted(families))})")
    config_cls, model_cls = families[method]
    names = {f.name for f in fields(config_cls)}
    unknown = sorted(set(info["config"]) - names)
    if unknown:
        raise DraftsmithError(f"{where}: config has fields {unknown} that {config_cls.__name__} does not know")
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in info["config"].items()}
    model = model_cls(config_cls(**config))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftsmithError(
            f"{where}: weights do not match the {method} config (missing {missing}, unexpected {unexpected})"
        )
    return model.eval()


def save_native(model: torch.nn.Module, target: Target, out: str | Path, extra: dict | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``model`` (a drafter network with ``method``/``cfg``;
    one with a ``for_export()`` method, e.g. a LoRA-trained draft LM, writes what that returns)."""
    if hasattr(model, "for_export"):
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
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if "draftsmith" not in ckpt:
        raise DraftsmithError(f"{path}: not a checkpoint of a draftsmith DrafterModule (no 'draftsmith' entry)")
    state = {k.removeprefix("drafter."): v for k, v in ckpt["state_dict"].items() if k.startswith("drafter.")}
    return ckpt["draftsmith"], state


def is_native(path: Path) -> bool:
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        return False
    try:
        return json.loads((path / "config.json").read_text()).get("format") == FORMAT
    except json.JSONDecodeError:
        return False


def load_network(path: str | Path, target: Target | None = None) -> tuple[torch.nn.Module, dict]:
    """A trained drafter network and its record, from a native dir or a ``.ckpt``; checked against ``target``."""
    path = Path(path)
    info, state = _read_checkpoint(path) if path.is_file() else _read_native(path)
    if target is not None:
        check_fingerprint(info["target"], target.fingerprint, f"drafter {str(path)!r}")
    return build(info, state, str(path)).to(target.device if target is not None else "cpu"), info


def load_trained(path: str | Path, target: Target) -> Drafter:
    """The verifier's drafter for a trained network (with the top-k accuracies static trees need).

    A drafter that fine-tuned its target (Medusa-2) carries the adapted target as ``own_target``:
    it drafts for that target, and is scored against plain decoding of it.
    """
    model, info = load_network(path, target)
    drafter = model.as_drafter(info.get("topk_accuracy"))
    if hasattr(model, "adapt_target") and model.cfg.lora:
        drafter.own_target = model.adapt_target(target)
    return drafter
