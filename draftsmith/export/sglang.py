"""SGLang drafter directories, as SGLang's loaders read them: each family writes its own (its SGLang hook,
``families/<family>/export.py``, registered with ``@exports("sglang", ...)``: EAGLE-1, EAGLE-3 and DFlash), and this
format asks it for that block and makes the ``sglang.launch_server`` command.

An SGLang hook is ``hook(src, out, dtype, k) -> dict``: it writes the drafter dir ``out`` (floating-point weights in
``dtype``, None: as trained) as SGLang's loader for that family reads it (the facts, read in sgl-project/sglang
``python/sglang/srt``, are in the hook's module; no SGLang runs on this CPU, so the test suite checks the files
against them, and serves the EAGLE-3 dir in vLLM 0.32, which reads the same layout), and returns the server's
speculative flags, ``speculative-algorithm`` first (an EAGLE worker's chain of ``k`` tokens, default 4; DFlash's
block size).
"""

from __future__ import annotations

from pathlib import Path

from draftsmith.export.common import Source
from draftsmith.export.serve import DEFAULTS, Serving
from draftsmith.families.registry import export_hook


def export(src: Source, out: Path, dtype: str | None, serving: Serving = DEFAULTS) -> str:
    """Write the family's SGLang drafter dir; return the ``sglang.launch_server`` command (``serving.k`` tokens per
    round where the family drafts a chain, the target in ``serving.dtype``)."""
    flags = export_hook(src.method, "sglang")(src, out, dtype, serving.k)
    flags = {"speculative-algorithm": flags["speculative-algorithm"], "speculative-draft-model-path": out} | flags
    server = f"python -m sglang.launch_server --model-path {src.target_dir}"
    server += f" --dtype {serving.dtype}" if serving.dtype else ""
    return server + "".join(f" --{name} {value}" for name, value in flags.items())
