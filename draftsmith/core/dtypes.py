"""One dtype vocabulary: ``float32``, ``bfloat16``, ``float16`` (``fp32``, ``bf16``, ``fp16`` accepted as aliases)."""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def canonical_dtype(name: str, flag: str = "--dtype", allowed: tuple[str, ...] = tuple(DTYPES)) -> str:
    """The canonical name of ``name`` (an alias maps to it); a name outside ``allowed`` is one line naming ``flag``."""
    canonical = ALIASES.get(name, name)
    if canonical not in allowed:
        aliases = [a for a, c in ALIASES.items() if c in allowed]
        raise DraftsmithError(f"{flag} must be one of {', '.join(allowed)} (or {', '.join(aliases)}), got {name!r}")
    return canonical


def torch_dtype(name: str, flag: str = "--dtype") -> torch.dtype:
    return DTYPES[canonical_dtype(name, flag)]
