"""The KV cache's name in a transformers call: ``cache`` since transformers renamed ``past_key_values`` (the old name
still works there, with a FutureWarning, until 5.40), ``past_key_values`` before. draftsmith passes and reads the
cache by the name the model's own ``forward`` declares, so neither version warns and neither breaks."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


@functools.cache
def _parameters(forward) -> frozenset[str]:
    return frozenset(inspect.signature(forward).parameters)


def takes(module: torch.nn.Module, name: str) -> bool:
    """Whether ``module``'s ``forward`` declares the argument ``name`` (looked up once per class)."""
    return name in _parameters(type(module).forward)


def cache_arg(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``module(...)``: its ``forward``'s name for the KV cache."""
    return {("cache" if takes(module, "cache") else "past_key_values"): cache}


def output_cache(out: Any) -> Any:
    """The KV cache a transformers model output holds (``out.cache``, or ``out.past_key_values`` before the rename)."""
    fields = getattr(type(out), "__dataclass_fields__", {})
    return out.cache if "cache" in fields else out.past_key_values
