"""``draftsmith export``: the formats, which drafter methods each holds (those whose family has a hook for it,
``families/<family>/export.py``), and the entry function."""

from __future__ import annotations

from pathlib import Path

from draftsmith.core.dtypes import canonical_dtype
from draftsmith.core.files import made_whole, refuse_existing
from draftsmith.core.manifest import write_manifest
from draftsmith.errors import DraftsmithError
from draftsmith.export import hf, native, sglang, speculators, vllm
from draftsmith.export.common import load_source
from draftsmith.export.serve import Serving, model_drafter
from draftsmith.families import methods as family_methods
from draftsmith.families.registry import export_formats, unserved_reasons

FORMATS = {"native": native, "hf": hf, "vllm": vllm, "sglang": sglang, "speculators": speculators}
WHY_NOT = unserved_reasons()
"""Methods that engines cannot serve, and why (said in the refusal): each family says so in its ``export.py``."""


def methods(fmt: str) -> tuple[str, ...]:
    """Drafter methods ``fmt`` can hold: those whose family has a hook for it (native: every family draftsmith
    trains)."""
    return tuple(m for m in family_methods() if fmt == "native" or fmt in export_formats(m))


def serving_format(method: str) -> str:
    """The format a drafter of ``method`` is served in: vLLM's where vLLM serves the family, plain HF for draft
    LMs (a ``transformers`` assistant model or vLLM ``draft_model``), else draftsmith's own."""
    return next((fmt for fmt in ("vllm", "hf") if method in methods(fmt)), "native")


def check_supported(fmt: str, method: str) -> None:
    if method in methods(fmt):
        return
    able = [f for f in FORMATS if method in methods(f)]
    why = f" ({WHY_NOT[method]})" if method in WHY_NOT else ""
    raise DraftsmithError(f"--to {fmt} cannot hold a {method} drafter{why}; formats that can: {', '.join(able)}")


def write_export(
    src: Path,
    to: str,
    out: Path,
    dtype: str | None = None,
    target: str | None = None,
    scores: list[Path] | None = None,
    score_name: str | None = None,
    overwrite: bool = False,
    k: int | None = None,
) -> str:
    """``export`` without the printing: writes ``out`` and returns the command that serves it, drafting ``k``
    tokens per round with the target in the dtype the drafter was trained for. A ``rasd:`` spec writes its model
    drafter (``serve.model_drafter``)."""
    if to not in FORMATS:
        raise DraftsmithError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    if k is not None and k < 1:
        raise DraftsmithError(f"--k must be a positive number of draft tokens, got {k}")
    src, _ = model_drafter(src)
    out = Path(out).absolute()
    dtype = canonical_dtype(dtype) if dtype is not None else None
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"export: --out {out} is a file; name a directory to write the export in")
    refuse_existing(out, overwrite, "export")
    # the source is loaded and checked before anything is written, and the export is written beside ``out``
    # (``made_whole``): a refusal or a crash leaves the old export as it was
    if to == "hf" and hf.is_hf_dir(src):
        from draftsmith.targets import resolve

        target_dir = resolve(target) if target else None
        fingerprint = None

        def write(dest: Path) -> str:
            return hf.export_dir(src, dest, dtype, target_dir, Serving(k))
    else:
        source = load_source(src, target)
        check_supported(to, source.method)
        fingerprint = source.info["target"]

        def write(dest: Path) -> str:
            if to == "native":
                return native.export(source, dest, dtype, scores, score_name)
            return FORMATS[to].export(source, dest, dtype, Serving(k, source.info["target"].get("dtype")))

    commands = []

    def make(tmp: Path) -> None:
        command = write(tmp).replace(str(tmp), str(out))  # the command names where the export will be
        write_manifest(tmp, target=fingerprint, source=str(src), format=to, serve=command)
        commands.append(command)

    made_whole(out, make)
    return commands[0]


def export(
    src: Path,
    to: str,
    out: Path,
    dtype: str | None = None,
    target: str | None = None,
    scores: list[Path] | None = None,
    score_name: str | None = None,
    overwrite: bool = False,
    k: int | None = None,
) -> Path:
    """Export a trained drafter for serving and print the command that serves it (``draftsmith export``), the
    target in the dtype the drafter was trained for.

    Args:
        src: a ``DrafterModule`` Lightning checkpoint, a native export dir, (``--to hf``) a Hugging Face causal-LM
            / peft adapter directory, or a ``rasd:[KEY=VALUE,...:]DRAFTER`` spec: no engine serves the fused tree,
            so its model drafter is written (one line says so).
        to: ``native``, ``hf``, ``vllm``, ``sglang`` or ``speculators``.
        out: the directory to write.
        dtype: ``bfloat16``, ``float16`` or ``float32`` (or ``bf16``, ``fp16``, ``fp32``) for the floating-point
            weights (default: as trained).
        target: the target's model directory (default: the one the drafter records); the drafter's
            target fingerprint must match it.
        scores: ``draftsmith score`` report.json files whose rows for this drafter go in the native model card.
        score_name: the drafter's row name in those reports (default: matched by its path).
        overwrite: replace ``out`` if it exists.
        k: draft tokens per round in the serving command, the K it was scored best at (``draftsmith score --k
            auto``); default: 4, a Medusa's heads, a parallel drafter's trained depth (those two are also the most).
    """
    out = Path(out).absolute()
    _, note = model_drafter(src)
    if note:
        print(note)
    command = write_export(src, to, out, dtype, target, scores, score_name, overwrite, k)
    print(f"wrote {out}\n{command}")
    return out
