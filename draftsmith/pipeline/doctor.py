"""``draftsmith doctor``: why does this drafter accept so little? Loads a drafter of ours or a peer's checkpoint
(imported on the fly), runs ``eval.doctor``'s checks against the target and writes ``doctor.json`` / ``doctor.md``.

It lives here, not in ``eval``, because it reads peers' layouts through ``export.imports`` (which imports ``eval``).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from draftsmith.core import native
from draftsmith.core.files import write_whole
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.eval.doctor import CHECK_NAMES, FAIL, NOT_RUN, Check, markdown, run_checks
from draftsmith.export.imports import import_drafter
from draftsmith.families.registry import build
from draftsmith.targets import load_target, resolve_target


def read_drafter(path: Path, target: str, workdir: Path) -> tuple[dict, dict, str]:
    """(record, weights, what it is) of a native dir, a ``.ckpt``, or a peer checkpoint imported into ``workdir``.
    A peer checkpoint the importer refuses raises its one line."""
    if path.is_file() or native.is_native(path) or native.is_deepspeed(path):
        info, state = native.read(path)
        return info, state, "checkpoint" if path.is_file() or native.is_deepspeed(path) else "native dir"
    with contextlib.redirect_stdout(io.StringIO()):  # the importer's "score it:" advice is not doctor's
        imported = import_drafter(path, target, workdir / "imported")
    info, state = native.read(imported)
    return info, state, f"imported from the {info['imported_from']['layout']} layout"


def refused(message: str) -> list[Check]:
    """The lines for a checkpoint that could not be read: the importer's refusal under the check it belongs to."""
    name = "draft vocabulary" if "d2t" in message else "identity"
    if "another target" not in message and name == "identity":
        name = "import"
    head = Check(name, FAIL, message, cause="the checkpoint cannot be read for this target", fix="see the finding")
    rest = [Check(n, NOT_RUN, "the checkpoint could not be read") for n in CHECK_NAMES if n != name]
    return [head, *rest]


def doctor(
    src: Path,
    target: str,
    prompts: str = "builtin:heldout",
    out: Path | None = Path("runs/doctor"),
    num_prompts: int = 16,
    max_new_tokens: int = 48,
    k: int = 4,
    dtype: str | None = None,
    prompt_field: str = "prompt",
    device: str = "cpu",
) -> dict:
    """Why does this drafter accept so little? One line per check: pass, or fail with the cause and the fix.

    Each check names a mismatch between the drafter's training and its serving. Checks: target identity (vocabulary, hidden size, tokenizer and special tokens, config), feature layers (the
    recorded ids against the readings one below and one above, by measured first-token acceptance), draft vocabulary
    (d2t / t2d, coverage of the target's greedy tokens), position offset (labels one before / after), training-time
    test (acceptance by depth on its own features against the target's) and prediction against measurement (τ by the
    real verifier beside the teacher-forced estimate and the val τ_est training recorded).

    Args:
        src: the drafter: a native drafter dir, a ``.ckpt``, or a peer's checkpoint in any layout ``draftsmith
            import`` reads (imported on the fly into a temporary dir).
        target: ``default``, ``smollm2`` or a local Hugging Face model directory, optionally ``:DTYPE``.
        prompts: ``builtin:heldout``, ``builtin:chat-heldout``, ``builtin:mt-bench``, a JSONL file or a local dataset.
        out: directory for doctor.json and doctor.md (none written when null).
        num_prompts: how many prompts to use (the first N).
        max_new_tokens: tokens the target generates greedily per prompt (the text every check measures on).
        k: tokens drafted per round by the verifier.
        dtype: the dtype the target computes in: float32, bfloat16, float16 or auto; default: the target's
            ``:DTYPE``, else auto.
        prompt_field: the prompt's field name in JSONL / dataset sources.
        device: where the target and the drafter run: ``cpu``, or ``cuda`` / ``cuda:N``.
    """
    drafter = Path(src)
    if not drafter.exists():
        raise DraftsmithError(f"doctor: {drafter} does not exist")
    if drafter.is_dir() and not (drafter / "config.json").is_file() and not native.is_deepspeed(drafter):
        raise DraftsmithError(f"doctor: {drafter} holds no config.json (not a drafter dir, checkpoint or export)")
    if k < 1:
        raise DraftsmithError(f"doctor --k: tokens drafted per round must be positive, got {k}")
    texts = load_prompts(prompts, prompt_field, num_prompts)  # the cheap checks first: a target may build for minutes
    resolved = resolve_target(target, dtype, device)
    with tempfile.TemporaryDirectory(prefix="draftsmith-doctor-") as tmp:
        try:
            info, state, source = read_drafter(drafter, str(resolved), Path(tmp))
        except DraftsmithError as e:
            if drafter.is_file() or native.is_native(drafter):
                raise
            info, state, source, checks = None, None, "peer checkpoint", refused(str(e))
        model = load_target(resolved, device=device)
        if info is not None:
            network = build(info, state, str(drafter))
            ids = [encode(p, model.tokenizer) for p in texts]
            checks = run_checks(network, info, model, ids, k, max_new_tokens)
    report = {
        "drafter": str(drafter),
        "source": source,
        "method": info.get("method") if info else None,
        "target": model.fingerprint,
        "prompts_source": prompts,
        "prompts": len(texts),
        "max_new_tokens": max_new_tokens,
        "k": k,
        "checks": [c.to_dict() for c in checks],
        "failed": [c.name for c in checks if c.status == FAIL],
    }
    print(f"doctor: {drafter} ({source}) against {resolved.name} on {len(texts)} prompts")
    for c in checks:
        print(c.line())
    if out is not None:
        write_whole(Path(out) / "doctor.json", json.dumps(report, indent=2) + "\n")
        write_whole(Path(out) / "doctor.md", markdown(report))
        print(f"doctor: wrote {Path(out) / 'doctor.json'} and doctor.md")
    return report
