"""The one registry of drafter families: ``method`` name -> (config dataclass, network class).

A family registers its network with ``@register("method", ..., config=ConfigClass)`` in its own subpackage;
``draftsmith.families`` imports every subpackage, so a lookup sees them all. The record of a trained drafter
(``core.native``) names its method and the registry rebuilds it. A family an engine serves also registers its export
hooks (``@exports("vllm", "method")`` in its ``export.py``): the format modules of ``draftsmith.export`` ask
``export_hook`` for the family's block and hold exactly the methods with a hook for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from draftsmith.core import native
from draftsmith.core.draft import Drafter
from draftsmith.core.fingerprint import check_fingerprint, identity_diff
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.layers.shape import read_record


@dataclass(frozen=True)
class Family:
    """One registered method: its config dataclass and the network class built from it."""

    method: str
    config: type
    network: type


RENAMED = {"sorted_draft_lm": "s2d"}
"""A method's former name -> its name: a drafter saved under the former name still loads (read side only: a drafter
is saved under its method's name)."""

MOVED = {
    f"draftsmith.families.{name}.": f"draftsmith.families.{home}.{name}."
    for name, home in (("peagle", "eagle"), ("falcon", "eagle"), ("tlt", "eagle"), ("dspark", "dflash"))
}
"""A module path's former prefix -> its prefix now (the algorithms built on a family moved into its folder): a recipe
or a run's saved ``config.yaml`` naming a former path is refused in one line that gives the path now (``check_moved``)."""


def check_moved(config, label: str, where: str = "") -> None:
    """A module path in ``config`` (a recipe, or a run's saved ``config.yaml``) that ``MOVED``: one line, ``label``
    first, giving its path now (jsonargparse printed 60 lines of usage and errors, "No module named" among them)."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        field = f"{where}.{key}" if where else str(key)
        if isinstance(value, str):
            old = next((o for o in MOVED if value.startswith(o)), None)
            if old is not None:
                raise DraftsmithError(
                    f"{label}: {field}: {value} has moved; write {MOVED[old]}{value.removeprefix(old)}"
                )
        else:
            check_moved(value, label, field)


_FAMILIES: dict[str, Family] = {}
_EXPORT_HOOKS: dict[tuple[str, str], Callable] = {}
_UNSERVED: dict[str, str] = {}


def register(*methods: str, config: type):
    """Class decorator: the network class serves ``methods`` (e.g. ``"eagle1", "eagle3"``), built from ``config``."""

    def wrap(network: type) -> type:
        for method in methods:
            if method in _FAMILIES:
                raise DraftsmithError(f"drafter method {method!r} is registered twice")
            _FAMILIES[method] = Family(method, config, network)
        return network

    return wrap


def exports(fmt: str, *methods: str):
    """Function decorator: the family's hook writing a drafter of ``methods`` in the export format ``fmt`` (what a
    hook is given and returns is that format's contract, told in ``draftsmith/export/<fmt>.py``)."""

    def wrap(hook: Callable) -> Callable:
        for method in methods:
            if (method, fmt) in _EXPORT_HOOKS:
                raise DraftsmithError(f"{fmt} export hook of drafter method {method!r} is registered twice")
            _EXPORT_HOOKS[method, fmt] = hook
        return hook

    return wrap


def unserved(*methods: str, why: str) -> None:
    """Record that no serving engine loads ``methods`` (a family with no export hook) and ``why``: the formats'
    refusal says it."""
    for method in methods:
        _UNSERVED[method] = why


def unserved_reasons() -> dict[str, str]:
    """Methods no serving engine loads, and why (``unserved``)."""
    return dict(_UNSERVED)


def export_formats(method: str) -> tuple[str, ...]:
    """The export formats ``method``'s family has a hook for, in the order they registered."""
    return tuple(fmt for m, fmt in _EXPORT_HOOKS if m == method)


def export_hook(method: str, fmt: str) -> Callable:
    """The hook writing a ``method`` drafter in ``fmt``; a method without one is one line naming the formats it has."""
    if (method, fmt) not in _EXPORT_HOOKS:
        able = ", ".join(export_formats(method)) or "none but draftsmith's native one"
        why = f" ({_UNSERVED[method]})" if method in _UNSERVED else ""
        raise DraftsmithError(f"--to {fmt} cannot hold a {method} drafter{why}; its family exports to: {able}")
    return _EXPORT_HOOKS[method, fmt]


def family(method: str, where: str = "drafter") -> Family:
    method = RENAMED.get(method, method)
    if method not in _FAMILIES:
        raise DraftsmithError(f"{where}: unknown drafter method {method!r} (known: {', '.join(sorted(_FAMILIES))})")
    return _FAMILIES[method]


def methods() -> list[str]:
    return sorted(_FAMILIES)


def extended(base, config: type, **more):
    """A ``config`` built on ``base``, a config of the class it extends (DSpark's on DFlash's, P-EAGLE's and Falcon's
    on EAGLE's): ``base``'s fields as they are (its ``LayerShape`` too, which ``asdict`` would make a dict) and
    ``more``."""
    return config(**{f.name: getattr(base, f.name) for f in fields(base)}, **more)


def build_network(method: str, config: dict, where: str = "drafter") -> torch.nn.Module:
    """An untrained network of ``method`` from a JSON config record (lists become tuples; a layer's shape, nested
    or in the flat form of drafters saved before, a ``LayerShape``)."""
    fam = family(method, where)
    config = read_record(config, fam.config)
    unknown = sorted(set(config) - {f.name for f in fields(fam.config)})
    if unknown:
        raise DraftsmithError(f"{where}: config has fields {unknown} that {fam.config.__name__} does not know")
    return fam.network(fam.config(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}))


def build(info: dict, state: dict[str, torch.Tensor], where: str) -> torch.nn.Module:
    """Rebuild a drafter network from ``core.native.describe()``'s record and its weights; weights holding a
    non-finite value are refused (what a fit that diverged left: it drafts nothing, whatever its ``val/tau_est``)."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DraftsmithError(
            f"{where}: {len(bad)} of {len(state)} weight tensors hold non-finite values (first: {bad[0]}), the "
            f"drafter of a fit that diverged: nothing to draft with"
        )
    model = build_network(info.get("method"), info["config"], where)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftsmithError(
            f"{where}: weights do not match the {info['method']} config (missing {missing}, unexpected {unexpected})"
        )
    return model.eval()


def load_network(path: str | Path, target: Target | None = None) -> tuple[torch.nn.Module, dict]:
    """A trained drafter network and its record, from a native dir or a ``.ckpt``; checked against ``target``."""
    info, state = native.read(path)
    info = {**info, "method": RENAMED.get(info.get("method"), info.get("method"))}
    if target is not None:
        check_fingerprint(made_for(info, target), target.fingerprint, f"drafter {str(path)!r}")
    return build(info, state, str(path)).to(target.device if target is not None else "cpu"), info


def made_for(info: dict, target: Target) -> dict:
    """The fingerprint of the target a drafter record was made for that ``target`` is checked against: of a drafter
    made for several targets (a sorted draft LM, S2D: ``targets``), the one of ``target``'s identity, else
    ``target``."""
    for fingerprint in info.get("targets") or []:
        if not identity_diff(fingerprint, target.fingerprint):
            return fingerprint
    return info["target"]


def load_trained(path: str | Path, target: Target) -> Drafter:
    """The verifier's drafter for a trained network (with the top-k accuracies static trees need).

    A drafter that fine-tuned its target (Medusa-2) carries the adapted target as ``own_target``:
    it drafts for that target, and is scored against plain decoding of it.
    """
    model, info = load_network(path, target)
    drafter = model.as_drafter(info.get("topk_accuracy"))
    drafter.own_target = model.adapted_target(target)
    return drafter
