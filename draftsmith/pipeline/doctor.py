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

import yaml

from draftsmith.core import native
from draftsmith.core.files import write_whole
from draftsmith.data.magpie import user_prefix
from draftsmith.data.prompts import Prompt, encode, load_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.eval.doctor import CHECK_NAMES, FAIL, NOT_RUN, Check, markdown, run_checks, trained_norms
from draftsmith.eval.doctor.serving import MAPS_CAUSE, MAPS_FIX
from draftsmith.export.imports import import_drafter
from draftsmith.families.registry import build
from draftsmith.targets import ResolvedTarget, load_target


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


def build_as_trained(info: dict, state: dict, where: str):
    """The network of a record and its weights; an EAGLE-3 whose recorded norm flags do not match the norm weights
    it holds is built with the flags its weights imply (the norm check then names the recorded ones)."""
    try:
        return build(info, state, where)
    except DraftsmithError:
        config = info.get("config") or {}
        implied = trained_norms(state)
        if info.get("method") != "eagle3" or all(bool(config.get(f, False)) == v for f, v in implied.items()):
            raise
        return build(info | {"config": config | implied}, state, where)


TEMPLATE_ROWS = 64
"""Training rows read to see whether the data's prompts are in the target's chat template."""


def training_data(drafter: Path, info: dict) -> Path | None:
    """The generated data dir a drafter of ours was trained on, as its records name it: the native dir's
    ``manifest.json`` (the fit stage's data), else the run's ``config.yaml`` beside its checkpoint."""
    manifest = drafter / "manifest.json" if drafter.is_dir() else None
    if manifest is not None and manifest.is_file():
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            data = (json.loads(manifest.read_text()).get("stage") or {}).get("fit", {}).get("data") or {}
            train = (data.get("init_args") or data).get("train")
            if train:
                return Path(train)
    checkpoint = Path(info["checkpoint"]) if info.get("checkpoint") else drafter if drafter.is_file() else None
    for parent in list(checkpoint.parents)[:4] if checkpoint is not None else ():
        if (parent / "config.yaml").is_file():
            with contextlib.suppress(yaml.YAMLError, AttributeError):
                data = (yaml.safe_load((parent / "config.yaml").read_text()) or {}).get("data") or {}
                train = (data.get("init_args") or data).get("train")
                if train:
                    return Path(train)
    return None


def training_template(drafter: Path, info: dict, tokenizer) -> dict:
    """What the drafter's training data says of the chat template: how many of its first prompts begin with the
    target's template's user prefix (``rows``, ``templated``) and the ``chat_template`` setting it records; or
    ``why`` it could not be read."""
    from draftsmith.data.shards import load_generated

    where = training_data(drafter, info)
    if where is None:
        return {"why": "the drafter's records name no training data"}
    try:
        dataset, metadata = load_generated(where)
    except (DraftsmithError, OSError, FileNotFoundError) as e:
        return {"why": f"{where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"}
    prefix = user_prefix(tokenizer)
    rows = dataset.select(range(min(TEMPLATE_ROWS, len(dataset))))
    starts = [list(ids[: len(prefix)]) == prefix for ids in rows["input_ids"]]
    setting = (metadata.get("settings") or {}).get("chat_template")
    return {"data": str(where), "rows": len(starts), "templated": sum(starts), "chat_template": setting}


def two_ways(texts: list[Prompt], tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts in the target's chat template (a plain text as the user's turn) and raw (chat messages as
    ``encode`` renders them without a template)."""
    templated, raw = [], []
    for p in texts:
        messages = list(p.messages) if p.messages is not None else [{"role": "user", "content": p.text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        templated.append(list(ids))
        raw.append(encode(p, tokenizer, chat_template=False))
    return templated, raw


def refused(message: str) -> list[Check]:
    """The lines for a checkpoint that could not be read: the importer's refusal under the check it belongs to (maps
    that disagree with the draft vocabulary check's cause and fix)."""
    name = "draft vocabulary" if "d2t" in message else "identity"
    if "another target" not in message and name == "identity":
        name = "import"
    cause, fix = "the checkpoint cannot be read for this target", "see the finding"
    if name == "draft vocabulary" and "inconsistent" in message:
        cause, fix = MAPS_CAUSE, MAPS_FIX
    head = Check(name, FAIL, message, cause=cause, fix=fix)
    rest = [Check(n, NOT_RUN, "the checkpoint could not be read") for n in CHECK_NAMES if n != name]
    return [head, *rest]


def doctor(
    src: Path,
    target: ResolvedTarget,
    prompts: str = "builtin:heldout",
    out: Path | None = Path("runs/doctor"),
    num_prompts: int = 16,
    max_new_tokens: int = 48,
    k: int = 4,
    prompt_field: str = "prompt",
    device: str = "cpu",
) -> None:
    """Why does this drafter accept so little? One line per check: pass, or fail with the cause and the fix; the
    command exits with status 1 when a check fails (0 when none does).

    Each check names a mismatch between the drafter's training and its serving. Checks: target identity
    (vocabulary, hidden size, tokenizer and special tokens, config), feature layers (the recorded ids against the
    readings one below and one above, by measured first-token acceptance), norm conventions (EAGLE-3.1's fc_norm,
    norm_before_fc and norm_output, and speculators' norm_before_residual, as recorded against the norm weights held
    and every setting measured), position
    offset (labels one before / after), training-time test (acceptance by depth on its own features against the
    target's), chat template (acceptance in the target's chat template against raw prompts, and the training data's
    prompts against that template), draft vocabulary (d2t / t2d, coverage of the target's greedy tokens) and
    prediction against measurement (τ by the real verifier beside the teacher-forced estimate and the val τ_est
    training recorded) and engine reading (an export's or a peer's config.json as vLLM's and SGLang's loaders read
    it, field by field against what the drafter computes).

    Args:
        src: the drafter: a native drafter dir, a ``.ckpt``, or a peer's checkpoint in any layout ``draftsmith
            import`` reads (imported on the fly into a temporary dir).
        target: ``default``, ``smollm2`` or a local Hugging Face model directory, optionally ``:DTYPE`` (from Python
            a ``targets.ResolvedTarget``: ``draftsmith.cli`` resolves it once).
        prompts: ``builtin:heldout``, ``builtin:chat-heldout``, ``builtin:mt-bench``, a JSONL file or a local dataset.
        out: directory for doctor.json and doctor.md (none written when null).
        num_prompts: how many prompts to use (the first N).
        max_new_tokens: tokens the target generates greedily per prompt (the text every check measures on).
        k: tokens drafted per round by the verifier.
        prompt_field: the prompt's field name in JSONL / dataset sources.
        device: where the target and the drafter run: ``cpu``, or ``cuda`` / ``cuda:N``.
    """
    report = diagnose(src, target, prompts, out, num_prompts, max_new_tokens, k, prompt_field, device)
    if report["failed"]:
        raise SystemExit(1)


def diagnose(
    src: Path,
    target: ResolvedTarget,
    prompts: str = "builtin:heldout",
    out: Path | None = Path("runs/doctor"),
    num_prompts: int = 16,
    max_new_tokens: int = 48,
    k: int = 4,
    prompt_field: str = "prompt",
    device: str = "cpu",
) -> dict:
    """``doctor``'s work, its report returned (the arguments are ``doctor``'s)."""
    drafter = Path(src)
    if not drafter.exists():
        raise DraftsmithError(f"doctor: {drafter} does not exist")
    if drafter.is_dir() and not (drafter / "config.json").is_file() and not native.is_deepspeed(drafter):
        raise DraftsmithError(f"doctor: {drafter} holds no config.json (not a drafter dir, checkpoint or export)")
    if k < 1:
        raise DraftsmithError(f"doctor --k: tokens drafted per round must be positive, got {k}")
    texts = load_prompts(prompts, prompt_field, num_prompts)  # the cheap checks first: the target loads for seconds
    with tempfile.TemporaryDirectory(prefix="draftsmith-doctor-") as tmp:
        try:
            info, state, source = read_drafter(drafter, str(target), Path(tmp))
        except DraftsmithError as e:
            if drafter.is_file() or native.is_native(drafter):
                raise
            info, state, source, checks = None, None, "peer checkpoint", refused(str(e))
        model = load_target(target, device=device)
        if info is not None:
            network = build_as_trained(info, state, str(drafter))
            tokenizer = model.tokenizer
            ids = [encode(p, tokenizer) for p in texts]
            template = None
            if getattr(tokenizer, "chat_template", None):
                templated, raw = two_ways(texts, tokenizer)
                template = {"template": templated, "raw": raw, "record": training_template(drafter, info, tokenizer)}
            checks = run_checks(network, info, model, ids, k, max_new_tokens, template)
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
    print(f"doctor: {drafter} ({source}) against {target.name} on {len(texts)} prompts")
    for c in checks:
        print(c.line())
    if out is not None:
        write_whole(Path(out) / "doctor.json", json.dumps(report, indent=2) + "\n")
        write_whole(Path(out) / "doctor.md", markdown(report))
        print(f"doctor: wrote {Path(out) / 'doctor.json'} and doctor.md")
    return report
