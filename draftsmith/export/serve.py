"""The commands that serve a drafter, set as the verifier measured it: its draft length K and the target's dtype.

A vLLM command is ``vllm serve TARGET --dtype DTYPE --speculative-config JSON``. ``--dtype`` is always the dtype the
drafter was trained and measured in (vLLM's ``auto`` turns a float32 checkpoint into half precision, another model
than the one measured), and ``num_speculative_tokens`` the K it was measured at, capped where the drafter cannot
draft more (a Medusa's heads, a parallel drafter's trained depth).

Which engine serves what: vLLM serves one method at a time: a trained drafter (EAGLE-1/3, Medusa, the parallel
drafters, a draft LM), or prompt lookup (``ngram``: ``prompt_lookup_min`` / ``prompt_lookup_max``), or Arctic's
suffix decoding (``suffix``); SGLang serves EAGLE and, on CUDA, its own n-gram drafting (``NGRAM``). No engine
serves RASD's fused tree (retrieval candidates merged into a model drafter's tree in one verification), so a
``rasd:`` spec exports its model drafter (``model_drafter``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.families.specs import DraftModel, Rasd, Trained, parse_spec


@dataclass(frozen=True)
class Serving:
    """How the serving command sets the drafter: as it was measured."""

    k: int | None = None
    """Draft tokens per round (None: the format's default, 4, or the drafter's heads / trained depth)."""
    dtype: str | None = None
    """The dtype the target computes in (None: the engine's default; unsafe, see the module's docstring)."""


DEFAULTS = Serving()
"""The format's defaults, the engine's dtype."""


def at_k(speculative: dict, k: int | None) -> dict:
    """``speculative`` (a vLLM ``--speculative-config``) drafting ``k`` tokens per round; a Medusa drafts at most its
    heads and a parallel drafter at most its trained depth (the exporter's value is then the cap)."""
    if k is None:
        return speculative
    capped = speculative["method"] == "medusa" or speculative.get("parallel_drafting", False)
    tokens = min(k, speculative["num_speculative_tokens"]) if capped else k
    return speculative | {"num_speculative_tokens": tokens}


def vllm_command(target: Path | str, speculative: dict | None, dtype: str | None) -> str:
    """``vllm serve TARGET [--dtype DTYPE] [--speculative-config JSON]``."""
    command = f"vllm serve {target}"
    if dtype:
        command += f" --dtype {dtype}"
    if speculative:
        command += f" --speculative-config '{json.dumps(speculative)}'"
    return command


def ngram_config(k: int, max_ngram: int, min_ngram: int = 1) -> dict:
    """vLLM's prompt lookup as draftsmith's ``ngram:N`` drafts: the longest suffix of ``max_ngram`` down to
    ``min_ngram`` tokens (vLLM sets ``prompt_lookup_min`` to the max when it is left out: always written). Of equally
    long matches vLLM continues the earliest, draftsmith the latest, so acceptance may differ somewhat."""
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": max_ngram,
        "prompt_lookup_min": min_ngram,
    }


def draft_model_config(path: Path | str, k: int) -> dict:
    """vLLM's ``draft_model``: a causal LM of the target's vocabulary drafting ``k`` tokens."""
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}


RASD_NOTE = (
    "no engine serves RASD's fused tree: writing its model drafter {drafter} alone (vLLM serves prompt-lookup "
    "n-gram drafting as a separate method, and no engine reads draftsmith's datastore)"
)


def model_drafter(src: str | Path) -> tuple[Path, str | None]:
    """What an engine can serve of ``src``: a ``rasd:[KEY=VALUE,...:]DRAFTER`` spec's model drafter, with the line
    that says so; any other path as it is, with None."""
    text = str(src)
    if not text.startswith("rasd:"):
        return Path(src), None
    spec = parse_spec(text).spec
    assert isinstance(spec, Rasd)
    inner = parse_spec(spec.drafter).spec
    if not isinstance(inner, Trained | DraftModel):
        raise DraftsmithError(
            f"export {text}: its model drafter {spec.drafter!r} is no trained drafter or model directory, so there "
            "is nothing to export (no engine serves the fused tree; vLLM serves prompt lookup as method ngram)"
        )
    return Path(inner.path), RASD_NOTE.format(drafter=inner.path)
