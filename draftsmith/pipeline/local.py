"""``draftsmith pipeline``: the whole pipeline on any causal LM, locally, in one command.

    draftsmith pipeline --target DIR_OR_NAME [--dtype auto] --prompts SRC --families eagle3,eagle1,draft_lm --out RUN

Stages (``pipeline.stages``, the list ``slurm pipeline`` submits as jobs): the target (checked, its step measured,
every choice printed) → on-policy data (``data/train`` sampled on the training prompts, ``data/val`` greedy on
held-out ones split off them; a retrieval datastore of the training data) → the feature cache where it pays → each
family from the recipe set chosen for the target's size → the verifier at K = 4 and ``--k auto`` (where RASD's
fused drafter, retrieval over the fastest trained tree drafter, is scored too: ``pipeline.fused``) → every scored
drafter ranked by measured speed with how an engine serves it, the fastest servable one's command first, set at its
measured K and dtype, and the fastest trained drafter exported in its serving format (``pipeline.serving``) → the
report. Every stage's artifact under ``out`` is reused while its manifest records the same inputs, and an
interrupted stage resumes (generation from its saved shards, the feature cache from its finished shards, training
from scratch for the family it was training). When no trained drafter beats plain decoding it says so, and names
the servable drafter that does (if any) instead.

This module is the command: its arguments checked, every choice printed, the prompts split, the run handed to
the stage runner. The parts: ``pipeline.choices`` (what is chosen from the target), ``pipeline.sizing`` (the data
budget by time), ``pipeline.predict`` (the τ the learning curves predict), ``pipeline.progress`` (stage headers
and times), ``pipeline.runner`` (the stages run in order).
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith import targets
from draftsmith.core.machine import local_device
from draftsmith.data.prompts import BUILTIN, BUILTIN_CHAT, load_prompts
from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.choices import (
    LARGE,
    choose_families,
    choose_recipe_set,
    device_choice,
    inspect_target,
    scaled_runs,
)
from draftsmith.pipeline.runner import run_pipeline
from draftsmith.pipeline.sizing import Sizing, passes
from draftsmith.train.suite import FAST, Budget, Plan

BUILTIN_HELDOUT = {BUILTIN[0]: BUILTIN[1], BUILTIN_CHAT[0]: BUILTIN_CHAT[1]}
"""The built-in training prompt sets and their held-out halves."""


def split_prompts(source: str, field: str, heldout: int, out: Path) -> tuple[str, str]:
    """Write the user's prompts as ``out/prompts/train.jsonl`` and ``heldout.jsonl`` (every n-th prompt held out,
    ``heldout`` of them, so both halves span the file); returns their paths."""
    prompts = load_prompts(source, field)
    if len(prompts) < heldout + 8:
        raise DraftsmithError(
            f"--prompts {source}: {len(prompts)} prompts; need at least {heldout + 8} ({heldout} held out for "
            f"scoring, --heldout) to train on some"
        )
    every = len(prompts) / heldout
    held = {int(i * every) for i in range(heldout)}
    folder = out / "prompts"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, keep in [("train", lambda i: i not in held), ("heldout", lambda i: i in held)]:
        lines = [_record(p) for i, p in enumerate(prompts) if keep(i)]
        path = folder / f"{name}.jsonl"
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:  # rewritten only when it changes
            path.write_text(text, encoding="utf-8")
        paths[name] = str(path)
    return paths["train"], paths["heldout"]


def _record(prompt) -> dict:
    record = {"prompt": prompt.text} if prompt.messages is None else {"messages": list(prompt.messages)}
    return record | {k: v for k, v in (("source", prompt.source), ("category", prompt.category)) if v is not None}


def pipeline(
    target: targets.TargetSpec,
    prompts: str = "builtin:chat-train",
    heldout_prompts: str | None = None,
    out: Path | None = None,
    families: list[str] | None = None,
    prompt_field: str = "prompt",
    num_prompts: int | None = None,
    hours: float = 1.0,
    heldout: int = 16,
    max_new_tokens: int = 64,
    steps_scale: float = 1.0,
    recipes: str | None = None,
    features: bool | None = None,
    draft_lm_layers: int | None = None,
    k: int = 4,
    fast: bool = False,
    device: str = "auto",
) -> Path:
    """Train drafters for any causal LM and prove what they buy: on-policy data, the feature cache where it pays,
    each family from a recipe set chosen for the target's size, the verifier at K and ``--k auto``, the export of
    the fastest drafter for serving, the report. Every choice is printed; every stage reused when current.

    Args:
        target: ``default``, ``smollm2`` or a local Hugging Face causal-LM directory, optionally ``:DTYPE`` (from
            Python a ``targets.TargetSpec``: ``draftsmith.cli`` parses it, with ``--dtype``; resolved here, once, on
            the device chosen).
        prompts: the training prompts: a JSONL file, a local dataset, or ``builtin:chat-train`` / ``builtin:train``;
            without ``--heldout-prompts``, ``--heldout`` of them are held out for validation and scoring.
        heldout_prompts: a separate held-out prompt set (e.g. ``builtin:mt-bench``; default for a built-in training
            set: its held-out half, ``builtin:chat-heldout`` / ``builtin:heldout``).
        out: run directory (default ``runs/pipeline-<target name>``).
        families: drafter families, e.g. ``eagle3,eagle1,draft_lm`` (default: eagle3, eagle1, medusa1, hydrapp,
            draft_lm; for the ``smollm2`` recipe set, eagle3_31 in place of eagle3); any recipe of the chosen set,
            and ``draft_lm``.
        prompt_field: the prompt's field name in JSONL / dataset sources.
        num_prompts: training prompts used (the first N); default: the most that fit ``hours``.
        hours: the time the run may take on this machine when ``num_prompts`` is not given: the training prompts
            (each family making ``passes(recipes)`` passes over them: 4 for ``smollm2``, else 2) are the most whose
            stages fit it by the target's speed, measured before any data is made (``size_budget``); the τ the
            measured learning curves predict for them is printed before the data is made.
        heldout: held-out prompts (validation data and the verifier's scoring set).
        max_new_tokens: tokens the target writes per prompt, for data and for scoring.
        steps_scale: each recipe's training steps times this.
        recipes: the recipe set: ``auto`` (by the target's size), ``default``, ``smollm2`` or a directory.
        features: cache the target's hidden states once and train from them (default: on for targets of 12+ layers).
        draft_lm_layers: the draft LM starts as the target's first N layers (default: a fifteenth of them, at least
            1; 0: the target's ``sibling/`` directory where it has one).
        k: the main table's draft length (``--k auto`` is scored too; each drafter is exported and ranked at its
            fastest measured K).
        fast: tiny budgets everywhere (smoke runs and tests).
        device: where every stage runs: ``auto`` (a CUDA GPU when there is one: generation, the feature cache and
            the verifier on it, the fits on every local GPU in bf16-mixed where it has bf16; else the CPU in
            float32), ``cpu`` (forced) or ``cuda`` (refused without a GPU); ``core.machine.choose_device``.
    """
    chosen = local_device(device)  # a device this machine cannot give: one line before any work
    spec = target
    if num_prompts is not None and num_prompts < 1:
        raise DraftsmithError(f"--num-prompts must be positive, got {num_prompts}")
    if not hours > 0:
        raise DraftsmithError(f"--hours must be positive, got {hours:g}")
    if heldout < 1:
        raise DraftsmithError(f"--heldout must be positive, got {heldout} (its prompts validate and score drafters)")
    if families:  # a name no recipe set holds is refused before the target is inspected (a built-in one is built)
        sets = ["", LARGE] if recipes in (None, "auto") else [recipes if recipes != "default" else ""]
        refusals = []
        for recipe_set in sets:
            try:
                choose_families(families, recipe_set)
            except DraftsmithError as e:
                refusals.append(e)
        if len(refusals) == len(sets):
            raise refusals[0]
    out = Path(out or f"runs/pipeline-{Path(spec.source).name}")
    if out.exists() and not out.is_dir():
        raise DraftsmithError(f"--out {out} is a file; name a run directory (a new one, or a pipeline run's to reuse)")
    counts = {}  # the cheap inputs first: a built-in target may build for minutes
    for source in (prompts, heldout_prompts):
        if source is not None:
            counts[source] = len(load_prompts(source, prompt_field))
    print("[choices] (each can be overridden; see draftsmith pipeline --help)")
    device_choice(chosen)
    info = inspect_target(spec, chosen.torch)
    resolved = info.target  # once, for every stage
    print(
        f"  target {info.dir}: {info.model_type}, {info.layers} layers, hidden {info.hidden}, vocab {info.vocab}, "
        f"{'a' if info.chat_template else 'no'} chat template"
    )
    computed = resolved.dtype
    print(f"  dtype {computed} (--dtype {spec.dtype})")
    recipe_dir, why = choose_recipe_set(info, recipes)
    print(f"  recipes {recipe_dir or 'default'}: {why} (--recipes)")
    drafters, draft_lm = choose_families(families, recipe_dir)
    if heldout_prompts is None and prompts in BUILTIN_HELDOUT:  # a built-in set has its own held-out half
        heldout_prompts = BUILTIN_HELDOUT[prompts]
    if heldout_prompts is None:
        train_src, heldout_src = split_prompts(prompts, prompt_field, heldout, out)
        available = counts[prompts] - heldout
        print(f"  prompts: {prompts} split into {train_src} and {heldout} held out in {heldout_src} (--heldout)")
    else:
        train_src, heldout_src = prompts, heldout_prompts
        available = counts[prompts]
        print(f"  prompts: {train_src} for training, {heldout_src} held out (--heldout-prompts)")
    given = num_prompts or available  # sized by time in the run when not given
    full = Budget(given, max_new_tokens, heldout, fit_scale=steps_scale, epochs=passes(recipe_dir))
    budget = FAST if fast else full
    sizing = None if fast or num_prompts is not None else Sizing(hours, available)
    cache = info.layers >= 12 if features is None else features
    print(f"  feature cache {'on' if cache else 'off'}: the target has {info.layers} layers (--features)")
    if draft_lm_layers is None:
        draft_lm_layers = max(1, round(info.layers / 15)) if not (info.dir / "sibling").is_dir() else 0
    lm_layers = draft_lm_layers
    plan = Plan(
        budget,
        recipes=recipe_dir,
        drafters=tuple(drafters),
        prompts=(train_src, heldout_src),
        temperature=0.7,
        top_p=0.9,
        ks=(k,),
        features=cache,
        acceptance_head=False,
        draft_lm_layers=lm_layers,
        dtype=computed,
        draft_lm=draft_lm,
    )
    if draft_lm:
        init = f"the target's first {lm_layers} layer(s)" if lm_layers else "the target's sibling"
        print(f"  draft_lm: distilled from {init} (--draft-lm-layers)")
    runs, scaled = scaled_runs(drafters, plan, info)
    for line in scaled:
        print(f"  {line}")
    size = "sized by --hours once the target's speed is measured" if sizing else f"{budget.train_prompts}"
    print(
        f"  data: training prompts {size}, sampled at T 0.7 / top-p 0.9; {budget.score_prompts} held out greedy; "
        f"{budget.new_tokens} new tokens each (--num-prompts or --hours, --heldout, --max-new-tokens)"
    )
    record = {"pipeline": "local"}
    return run_pipeline(resolved, plan, out, budget, fast, k, runs, record=record, sizing=sizing, device=chosen)
