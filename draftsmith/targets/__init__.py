"""Built-in targets by name (``default``: the embedded toy target, built once; ``smollm2``: SmolLM2-135M-Instruct
converted once from its wheel), or any local HF model directory."""

from __future__ import annotations

from pathlib import Path

from draftsmith.core.target import Target


def resolve(target: str | Path) -> Path:
    """A ``--target`` value as a directory: ``default`` is the embedded default target (built once, cached),
    ``smollm2`` (or ``smollm2:bfloat16``) SmolLM2-135M-Instruct converted once from its wheel."""
    name = str(target)
    if name == "default":
        from draftsmith.targets import default

        return default.build()
    if name == "smollm2" or name.startswith("smollm2:"):
        from draftsmith.targets import smollm2

        return smollm2.resolve(name)
    return Path(target)


def load_target(target: str | Path, **kwargs) -> Target:
    """``Target.from_pretrained`` on a built-in target's name or a model directory."""
    return Target.from_pretrained(resolve(target), **kwargs)
