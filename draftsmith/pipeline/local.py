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
"""

from __future__ import annotations

import copy
import json
import logging
import math
import statistics
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draftsmith import targets
from draftsmith.core.hf_cache import cache_arg, output_cache
from draftsmith.core.machine import Device, local_device
from draftsmith.core.manifest import FILE as MANIFEST
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.core.target import check_fingerprint
from draftsmith.data.prompts import BUILTIN, BUILTIN_CHAT, load_prompts
from draftsmith.errors import DraftsmithError, user_error
from draftsmith.eval.compare import report
from draftsmith.eval.rows import read_rows
from draftsmith.eval.score import AUTO_K, ScoreConfig, score_specs, verify_ratios
from draftsmith.families.specs import Adaptive, DraftModel, Named, NGram, Trained
from draftsmith.pipeline.fused import datastore, fused_spec
from draftsmith.pipeline.serving import export_best
from draftsmith.pipeline.stages import STAGES
from draftsmith.train.fit import RECIPES, FitRun, load_recipe
from draftsmith.train.suite import FAST, Budget, Plan, make_data, recipe_steps, train_all

BUILTIN_HELDOUT = {BUILTIN[0]: BUILTIN[1], BUILTIN_CHAT[0]: BUILTIN_CHAT[1]}
"""The built-in training prompt sets and their held-out halves."""
DEFAULT_FAMILIES = ("eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm")
LARGE = "smollm2"
"""The recipe set tuned on a real 30-layer, 49k-vocabulary LLM (``configs/smollm2/``)."""
LARGE_FAMILIES = ("eagle3_31", "eagle1", "medusa1", "hydrapp", "draft_lm")
"""``LARGE``'s default families: EAGLE-3 with EAGLE-3.1's norms in place of EAGLE-3 (the recipe study's winner on
the packed corpus: τ higher on every held-out set, the spread between prompts included;
``benchmarks/results/recipe_smollm2.md``)."""


@dataclass(frozen=True)
class TargetInfo:
    """What the pipeline's choices are made from: the target's ``config.json``."""

    dir: Path
    model_type: str
    layers: int
    hidden: int
    vocab: int
    chat_template: bool


def inspect_target(target: targets.Targetlike) -> TargetInfo:
    """The target's directory (a built-in is built or converted on first use) and shape; a directory that is not a
    causal LM with a tokenizer is refused in one line."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = targets.resolve(target)
    if not (path / "config.json").is_file():
        raise DraftsmithError(f"--target {path}: not a model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise DraftsmithError(f"--target {path}: config.json is not a model config transformers knows ({e})") from None
    causal = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ([v] if isinstance(v, str) else v)}
    archs = getattr(config, "architectures", None) or []
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (archs and not set(archs) & causal):
        raise DraftsmithError(
            f"--target {path}: not a causal LM (config.json: model_type {config.model_type!r}, architectures "
            f"{archs}); draftsmith drafts for models AutoModelForCausalLM loads"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (ValueError, OSError) as e:
        raise DraftsmithError(f"--target {path}: no tokenizer loads from it ({str(e).splitlines()[0]})") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return TargetInfo(
        path,
        config.model_type,
        text.num_hidden_layers,
        text.hidden_size,
        text.vocab_size,
        bool(getattr(tokenizer, "chat_template", None)),
    )


def _recipe_set(info: TargetInfo, recipes: str | None) -> tuple[str, str]:
    """The recipe directory (``Plan.recipes``) and why it was chosen."""
    if recipes not in (None, "auto"):
        given = "" if recipes == "default" else recipes
        path = RECIPES / given if not Path(given).is_absolute() else Path(given)
        if not path.is_dir():
            raise DraftsmithError(f"--recipes {recipes}: no such recipe set (default, {LARGE} or a directory)")
        return (str(path) if Path(given).is_absolute() else given), "as given (--recipes)"
    if info.vocab > 8192 or info.layers >= 12:
        return LARGE, f"{info.layers} layers, vocabulary {info.vocab}: sized like a real LLM (configs/{LARGE}/)"
    return "", f"{info.layers} layers, vocabulary {info.vocab}: a small model (configs/, tuned on the toy target)"


def _trains_on_generated_data(recipe: Path) -> bool:
    """A recipe the pipeline trains as a family: a drafter of the target fed the pipeline's generated data (not the
    draft LM's own stages, the acceptance head, nor a recipe of another data module: FastDraft's pre-training,
    cross-vocabulary distillation)."""
    import yaml

    data = (yaml.safe_load(recipe.read_text()) or {}).get("data") or {}
    return recipe.stem not in ("draft_lm", "acceptance_head") and "class_path" not in data


def _families(families: list[str] | None, plan_recipes: str) -> tuple[list[str], bool]:
    """The recipe-trained families and whether a draft LM is distilled; an unknown name is refused in one line."""
    wanted = list(families or (LARGE_FAMILIES if plan_recipes == LARGE else DEFAULT_FAMILIES))
    wanted = [f.strip() for name in wanted for f in name.split(",") if f.strip()]
    folder = Path(plan_recipes) if Path(plan_recipes).is_absolute() else RECIPES / plan_recipes
    available = sorted(p.stem for p in folder.glob("*.yaml") if _trains_on_generated_data(p))
    unknown = [f for f in wanted if f not in available and f != "draft_lm"]
    if unknown or not wanted:
        raise DraftsmithError(
            f"--families {','.join(unknown) or '(none)'}: not a family with a recipe in {folder}; "
            f"choose from {', '.join([*available, 'draft_lm'])}"
        )
    return [f for f in wanted if f != "draft_lm"], "draft_lm" in wanted


def _scaled_runs(families: list[str], plan: Plan, info: TargetInfo) -> tuple[dict[str, FitRun], list[str]]:
    """Per family, what is scaled to the target (a draft vocabulary at most half the target's), and why."""
    runs, why = {}, []
    for name in families:
        args = load_recipe(plan.recipe(name))["model"].get("init_args", {})
        size = args.get("draft_vocab_size")
        if size and size > info.vocab // 2:
            runs[name] = FitRun(model={"draft_vocab_size": info.vocab // 2})
            why.append(f"{name}: draft vocabulary {info.vocab // 2} (recipe {size}; the target has {info.vocab})")
    return runs, why


def check_families(plan: Plan, target: str, runs: dict[str, FitRun]) -> None:
    """Build each family's module on the target before any data is made, so a family the target cannot feed is
    refused in one line now rather than after the data."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningModule

    from draftsmith.train.fit import configure

    for name in plan.drafters:
        config = configure(plan.recipe(name), replace(runs.get(name, FitRun()), target=target))
        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(LightningModule, "model")
        try:
            parser.instantiate_classes(parser.parse_object({"model": config["model"]}))
        except Exception as e:  # noqa: BLE001 - jsonargparse wraps the family's own refusal
            cause = user_error(e)
            if cause is None:
                raise
            raise DraftsmithError(f"--families {name}: {cause}") from None


class Progress:
    """Prints each stage's header with its estimated time, and records the time it took."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.seconds, self.estimates = names, {}, {}
        self.started, self.current = time.perf_counter(), None

    def start(self, name: str, estimate_s: float | None = None) -> None:
        self.stop()
        self.current, self.at = name, time.perf_counter()
        guess = f" (estimated {_duration(estimate_s)})" if estimate_s else ""
        if estimate_s:
            self.estimates[name] = round(estimate_s)
        print(f"[{self.names.index(name) + 1}/{len(self.names)}] {name}: {STAGES[name]}{guess}", flush=True)

    def stop(self) -> None:
        if self.current:
            self.seconds[self.current] = round(time.perf_counter() - self.at, 1)
            self.current = None

    def summary(self) -> dict:
        self.stop()
        total = round(time.perf_counter() - self.started, 1)
        return {"stages_seconds": self.seconds, "estimated_seconds": self.estimates, "total_seconds": total}


def _duration(seconds: float) -> str:
    return f"~{seconds:.0f} s" if seconds < 90 else f"~{seconds / 60:.0f} min"


@dataclass(frozen=True)
class Speeds:
    """The target's speed on this machine, measured in the target stage; the time estimates come from it."""

    step_s: float
    """One decoding step (one new token, one sequence, a 64-token cache)."""
    batch_step_s: float
    """One decoding step of 16 sequences (generation runs batched)."""
    forward_tokens_s: float
    """Tokens per second of a full forward over 4 × 128 tokens (training and the feature cache)."""


def measure_speeds(t) -> Speeds:
    """The speeds of a loaded ``Target`` on its device (a few seconds)."""
    import torch

    ids = torch.randint(0, t.vocab_size, (16, 65)).to(t.device)

    def timed(fn, repeats: int = 3) -> float:
        fn()
        times = []
        for _ in range(repeats):
            at = time.perf_counter()
            fn()
            if t.device.type == "cuda":  # the GPU's work done, not only queued
                torch.cuda.synchronize(t.device)
            times.append(time.perf_counter() - at)
        return statistics.median(times)

    with torch.inference_mode():
        _, step = verify_ratios(t, ids[0, :64].tolist(), [1], 5)
        many = output_cache(t.model(ids[:, :64], use_cache=True))
        batch = timed(lambda: t.model(ids[:, 64:], **cache_arg(t.model, copy.deepcopy(many)), use_cache=True))
        long = torch.randint(0, t.vocab_size, (4, 128)).to(t.device)
        forward = timed(lambda: t.model(long), 2)
    return Speeds(step, batch, long.numel() / forward)


def _estimates(speeds: Speeds, budget: Budget, plan: Plan, n_specs: int, n_blocks: int) -> dict[str, float]:
    """Rough seconds per stage from the target's measured speed (printed as estimates, recorded beside the times
    taken in ``timings.json``)."""
    gen_tokens = (budget.train_prompts + budget.score_prompts) * budget.new_tokens
    train_tokens = budget.train_prompts * (budget.new_tokens + 64)
    steps = sum(recipe_steps(plan.recipe(n), budget) for n in plan.drafters) + 60 * plan.draft_lm  # distill steps
    # a training step runs the target forward over its batch (unless cached) and the drafter's forward and backward
    step_tokens = budget.batch_size * (budget.new_tokens + 64)
    per_step = step_tokens / speeds.forward_tokens_s * (1.5 if plan.features else 3.0)
    decode = budget.score_prompts * budget.new_tokens * speeds.step_s
    return {
        "generate": gen_tokens / 16 * speeds.batch_step_s,
        "features": train_tokens / speeds.forward_tokens_s if plan.features else 0.0,
        "fit": steps * per_step,
        "score": n_blocks * (n_specs + 1) * decode * 1.2,
    }


EPOCHS = 2.0
"""Passes over the training prompts each family makes by default (the data-scaling study's)."""
PASSES = {LARGE: 4.0}
"""Passes per recipe set where the recipe study measured more to pay: ``LARGE``'s EAGLE-3.1 at 4 passes over the
packed corpus's 250k and 1M tokens against 2 (``benchmarks/results/recipe_smollm2.md``, ``recipe_smollm2_250k.md``)."""


def passes(recipes: str) -> float:
    """The passes over the training prompts each family of the recipe set ``recipes`` makes (``PASSES``, else
    ``EPOCHS``)."""
    return PASSES.get(recipes, EPOCHS)


SMALLEST = 48
"""The fewest training prompts a time-sized budget takes (the smoke runs' size)."""


@dataclass(frozen=True)
class Sizing:
    """A data budget sized by time: the most training prompts whose stages fit ``hours`` by the target's measured
    speed, of the ``available`` ones."""

    hours: float
    available: int


def sized(budget: Budget, n: int) -> Budget:
    """``budget`` with ``n`` training prompts, each family fitting the budget's passes over them (``EPOCHS`` where it
    sets none; a time-sized budget)."""
    return replace(budget, train_prompts=n, epochs=budget.epochs or EPOCHS, fit_steps=0)


def size_budget(sizing: Sizing, speeds: Speeds, budget: Budget, plan: Plan, n_specs: int, n_blocks: int) -> Budget:
    """``budget`` with the most training prompts (at least ``SMALLEST``, at most ``sizing.available``) whose
    estimated stages (``_estimates``) fit ``sizing.hours``, each family fitting the budget's passes over them (its
    recipe's steps the floor). Refused in one line when even the smallest does not fit."""
    limit, smallest = sizing.hours * 3600, min(SMALLEST, sizing.available)
    if _seconds(smallest, speeds, budget, plan, n_specs, n_blocks) > limit:
        need = _duration(_seconds(smallest, speeds, budget, plan, n_specs, n_blocks))
        raise DraftsmithError(
            f"--hours {sizing.hours:g}: even {smallest} training prompts need {need} on this "
            "machine (its measured speed); give more --hours, or --num-prompts to size the data yourself"
        )
    lo, hi = smallest, sizing.available  # the largest n with seconds(n) <= limit: seconds grows with n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _seconds(mid, speeds, budget, plan, n_specs, n_blocks) <= limit else (lo, mid - 1)
    return sized(budget, lo)


def _seconds(n: int, speeds: Speeds, budget: Budget, plan: Plan, n_specs: int, n_blocks: int) -> float:
    """The estimated seconds of every stage with ``n`` training prompts (``sized``)."""
    b = sized(budget, n)
    return sum(_estimates(speeds, b, replace(plan, budget=b), n_specs, n_blocks).values())


DRIFT = 0.1
"""A saved sizing is kept while its prompts' estimate, by the speed measured again, exceeds the hours by at most this
share (the measured speed varies by a few percent from run to run; another machine is sized anew)."""


def sized_once(
    out: Path, sizing: Sizing, speeds: Speeds, budget: Budget, plan: Plan, n_specs: int, n_blocks: int
) -> Budget:
    """The budget ``size_budget`` chooses, recorded in ``out/sizing.json`` with every input of its estimate but the
    measured speed (``sizing_inputs``). A run made again with all of them the same keeps the saved training prompts
    (the data made for them stays current though the speed measured again differs a little) while they still fit
    the hours by this run's speed (within ``DRIFT``); any other input (``--max-new-tokens``, ``--families``, the
    batch size, the recipes, the passes, ...) sizes anew."""
    path = out / "sizing.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    inputs = sizing_inputs(sizing, budget, plan, n_specs, n_blocks)
    n = saved.get("train_prompts") if saved.get("inputs") == inputs else None
    fits = n is not None and _seconds(n, speeds, budget, plan, n_specs, n_blocks) <= sizing.hours * 3600 * (1 + DRIFT)
    if fits:
        budget, how = sized(budget, n), f"as chosen before ({path})"
    else:
        budget = size_budget(sizing, speeds, budget, plan, n_specs, n_blocks)
        out.mkdir(parents=True, exist_ok=True)
        record = {"inputs": inputs, "speeds": asdict(speeds), "train_prompts": budget.train_prompts}
        path.write_text(json.dumps(record, indent=2))
        how = "by this machine's measured speed"
    every = " (all of them)" if budget.train_prompts == sizing.available else ""
    print(
        f"  data: {budget.train_prompts} training prompts{every}, each family {budget.epochs:g} passes over them: the "
        f"most that fit --hours {sizing.hours:g}, {how}"
    )
    return budget


def sizing_inputs(sizing: Sizing, budget: Budget, plan: Plan, n_specs: int, n_blocks: int) -> dict:
    """Every input of ``size_budget``'s estimate but the measured speed, as JSON reads it back: the hours and the
    prompts available, the budget (new tokens, batch size, passes, ...), the plan besides its budget (families,
    recipes, feature cache, draft LM, ...), each family's recipe steps, and the drafters and blocks scored."""
    steps = {name: load_recipe(plan.recipe(name))["trainer"]["max_steps"] for name in plan.drafters}
    rest = {key: value for key, value in asdict(plan).items() if key != "budget"}
    inputs = asdict(sizing) | {"budget": asdict(budget), "plan": rest, "recipe_steps": steps}
    return json.loads(json.dumps(inputs | {"specs": n_specs, "blocks": n_blocks}))


def predicted_tau(plan: Plan, target: targets.ResolvedTarget, tokens: int) -> str:
    """What the learning curves measured for this recipe set and target (``configs/SET/learning_curve.json``, written
    by ``benchmarks/tables.py`` from the data-scaling and recipe studies) predict for ``tokens`` generated training
    tokens, per family the run trains, at the run's passes over the data (``plan.budget.epochs``), in words: τ at
    least 1 (a round commits the target's own token), and only within the token range the curve was measured over
    (outside it, said so instead of a number); or why there is no prediction."""
    path = RECIPES / (plan.recipes or ".") / "learning_curve.json"
    if not path.is_file():
        return f"no learning curve measured for the recipe set {plan.recipes or 'default'}"
    record = json.loads(path.read_text())
    measured_on = record["target"].split(":")[0]
    if Path(target.spec.source).name != measured_on:
        return f"no learning curve measured for this target (the recipe set's is {measured_on}'s)"
    epochs, parts = plan.budget.epochs, []
    if epochs <= 0:
        return "no learning curve for a run of its recipes' own steps (the curves are per passes over the data)"
    for family in plan.drafters:
        mine = [c for c in record["curves"] if c["family"] == family]
        curve = next((c for c in mine if c["epochs"] == epochs), None)
        if curve is None:
            if mine:
                passes = " / ".join(f"{c['epochs']:g}" for c in mine)
                parts.append(f"{family}: measured at {passes} passes, not at this run's {epochs:g}")
            continue
        lo, hi = curve["tokens"]
        if not lo <= tokens <= hi:  # a + b·ln(tokens) beyond its points is a guess (below them it falls below 1)
            parts.append(
                f"{family}: no prediction for {tokens:,} tokens, outside the measured {lo:,}–{hi:,} ({curve['source']})"
            )
            continue
        # a round commits at least the target's own token: τ < 1 is impossible, whatever a fitted line says
        taus = " / ".join(f"{max(1.0, c['a'] + c['b'] * math.log(tokens)):.2f} {s}" for s, c in curve["sets"].items())
        parts.append(f"{family} {taus} (within the measured {lo:,}–{hi:,}; {curve['source']})")
    if not parts:
        return f"no learning curve measured for {', '.join(plan.drafters) or 'these families'}"
    return (
        f"τ at K = {record['k']} predicted for {tokens:,} generated tokens and {epochs:g} passes over them: "
        + "; ".join(parts)
    )


def stage_devices(device: Device) -> str:
    """Where each stage runs and the fits' precision, in one line (the pipeline's and the quickstart's first lines):
    generation (batched HF generation), the feature cache and the verifier on ``device``'s torch device; the fits on
    all of its devices (DDP over more than one GPU; the acceptance head on one)."""
    where = device.torch
    fits = f"{where} × {device.devices} ({device.name})" if device.accelerator == "gpu" else where
    ddp = f" (DDP over {device.devices} GPUs; the acceptance head on one)" if device.devices > 1 else ""
    return (
        f"generation on {where} (batched HF generation), feature cache on {where}, fits on {fits} in "
        f"{device.precision}{ddp}, verifier on {where}"
    )


def device_choice(device: Device) -> None:
    """Print the device chosen and where each stage runs (``stage_devices``)."""
    print(f"  device {device.describe()} (--device)")
    print(f"  stages: {stage_devices(device)}")


def _check_out(out: Path, fingerprint: dict) -> None:
    """Refuse an output directory that holds another target's run (its ``manifest.json``)."""
    path = out / MANIFEST
    if path.is_file():
        previous = json.loads(path.read_text()).get("target")
        if previous:
            check_fingerprint(previous, fingerprint, f"--out {out} (a pipeline run)")


def run_pipeline(
    target: targets.ResolvedTarget | Path,
    plan: Plan,
    out: Path,
    budget: Budget,
    fast: bool = False,
    k: int = 4,
    runs: dict[str, FitRun] | None = None,
    record: dict | None = None,
    sizing: Sizing | None = None,
    device: Device | None = None,
) -> Path:
    """The pipeline's stages on ``target`` (resolved once by the caller, or a model dir resolved here in the plan's
    dtype) as ``plan`` says; every stage takes the resolved target; returns the report's
    path. ``runs``: per family, settings on top of its recipe; ``record``: what the run's manifest records;
    ``sizing``: the training prompts chosen by time once the target's speed is measured (``size_budget``) instead
    of ``budget``'s; ``device``: where every stage runs (default: this machine's, ``core.machine.local_device``).
    The libraries' logging is quieted for the run only (``quiet_libraries``)."""
    with quiet_libraries():
        return _run_stages(target, plan, out, budget, fast, k, runs, record, sizing, device or local_device())


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within: Lightning logs warnings only, its SLURM ``srun`` hint is silenced and transformers shows no progress
    bars (the stage lines say what runs; per-fit banners would bury them). On exit the logger's level, the warning
    filters and the progress-bar setting are what they were before."""
    import transformers

    logger = logging.getLogger("lightning.pytorch")
    level, bars = logger.level, transformers.utils.logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The `srun` command is available")
        logger.setLevel(logging.WARNING)
        transformers.utils.logging.disable_progress_bar()
        try:
            yield
        finally:
            logger.setLevel(level)
            if bars:
                transformers.utils.logging.enable_progress_bar()


def _run_stages(
    target: targets.ResolvedTarget | Path,
    plan: Plan,
    out: Path,
    budget: Budget,
    fast: bool,
    k: int,
    runs: dict[str, FitRun] | None,
    record: dict | None,
    sizing: Sizing | None,
    device: Device,
) -> Path:
    progress = Progress(list(STAGES))
    progress.start("target")
    target = plan.resolved(target)
    target_dir = target.path
    loaded = targets.load_target(target, batch_invariant=False, device=device.torch)
    fingerprint, dtype = loaded.fingerprint, loaded.dtype
    _check_out(out, fingerprint)
    speeds = measure_speeds(loaded)
    del loaded
    if plan.drafters:
        check_families(plan, str(target), runs or {})
    print(
        f"  one decoding step {1e3 * speeds.step_s:.1f} ms; 16 sequences {1e3 * speeds.batch_step_s:.1f} ms; "
        f"forward {speeds.forward_tokens_s:.0f} tokens/s (on {device.torch})"
    )
    if device.accelerator == "gpu":  # the estimates' factors (a fit step as 1.5-3 target forwards) are the CPU's
        print("  sizing: the CPU's cost model over the target's speeds measured on the GPU (not calibrated there)")
    specs = [Named("ngram", NGram())]
    ks = sorted({*plan.ks, k})
    n_specs, n_blocks = len(plan.drafters) + 3 + plan.acceptance_head, len(ks) + 1  # + rasd; + --k auto
    if sizing is not None:
        budget = sized_once(out, sizing, speeds, budget, plan, n_specs, n_blocks)
        plan = replace(plan, budget=budget)
    if plan.drafters:
        print(f"  {predicted_tau(plan, target, budget.train_prompts * budget.new_tokens)}")
    write_manifest(out, target=fingerprint, plan=asdict(plan), fast=fast, k=k, **(record or {}))
    guess = _estimates(speeds, budget, plan, n_specs, n_blocks)
    total = sum(guess.values())
    print(f"  estimated: {', '.join(f'{n} {_duration(v)}' for n, v in guess.items())} (total {_duration(total)})")
    progress.start("generate", guess["generate"])
    data = make_data(target, out, budget, plan, device)
    store = datastore(data[0])
    progress.start("features", guess["features"] or None)
    if not plan.features:
        print("  skipped: training runs the target in each step (the cache pays on deep targets; --features true)")
    progress.start("fit", guess["fit"])
    trained = train_all(target, data, out, budget, plan, fast, runs, device)
    progress.start("score", guess["score"])
    specs += [Named(name, Trained(str(path))) for name, path in trained.items() if not name.endswith("-head")]
    if "eagle1-head" in trained:
        specs.append(Named("eagle1-adaptive", Adaptive(str(trained["eagle1-head"]), 0.5)))
    if (target_dir / "sibling").is_dir():
        specs.insert(1, Named("sibling", DraftModel(str(target_dir / "sibling"))))
    if (out / "drafters" / "draft_lm_init").is_dir():
        specs.append(Named("draft_lm_undistilled", DraftModel(str(out / "drafters" / "draft_lm_init"))))
    blocks = [out / "score" / (f"k{kk}" if kk != AUTO_K else AUTO_K) for kk in [*ks, AUTO_K]]
    for kk, path in zip([*ks, AUTO_K], blocks, strict=True):
        if kk == AUTO_K:  # RASD over the trained tree drafter fastest at the main K, its shape chosen with the rest
            rows = read_rows(json.loads((out / "score" / f"k{k}" / "report.json").read_text())["drafters"])
            fused = fused_spec(rows, specs, store)
            specs += [fused] if fused else []
        config = ScoreConfig(
            plan.prompts[1],
            num_prompts=budget.score_prompts,
            k=kk,
            max_new_tokens=budget.new_tokens,
            device=device.torch,
        )
        stage = {"score": [asdict(s) | {"kind": type(s.spec).__name__} for s in specs], "config": asdict(config)}
        if not is_current(path, stage):
            print(
                f"  K = {kk}"
                + (f" (and {fused.name}: retrieval fused into its tree)" if kk == AUTO_K and fused else "")
            )
            score_specs(target, specs, config, path, stage)
    progress.start("export")
    if any(isinstance(s.spec, Trained) for s in specs):
        export_best(out, specs, target_dir, dtype, [path / "report.json" for path in blocks])  # this run's blocks
    else:
        print("  nothing trained to export")
    progress.start("report")
    path = report([out], k=k)
    timings = progress.summary()
    (out / "timings.json").write_text(json.dumps(timings, indent=2))
    minutes, seconds = divmod(round(timings["total_seconds"]), 60)
    per_stage = ", ".join(f"{name} {secs:.0f} s" for name, secs in timings["stages_seconds"].items())
    print(f"pipeline done in {minutes} min {seconds} s ({per_stage}); wrote {out / 'timings.json'}")
    print(f"report: {path / 'report.md'}")
    return path


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
    target: str,
    prompts: str = "builtin:chat-train",
    heldout_prompts: str | None = None,
    out: Path | None = None,
    families: list[str] | None = None,
    dtype: str = "auto",
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
        target: ``default``, ``smollm2`` or a local Hugging Face causal-LM directory, optionally ``:DTYPE``.
        prompts: the training prompts: a JSONL file, a local dataset, or ``builtin:chat-train`` / ``builtin:train``;
            without ``--heldout-prompts``, ``--heldout`` of them are held out for validation and scoring.
        heldout_prompts: a separate held-out prompt set (e.g. ``builtin:mt-bench``; default for a built-in training
            set: its held-out half, ``builtin:chat-heldout`` / ``builtin:heldout``).
        out: run directory (default ``runs/pipeline-<target name>``).
        families: drafter families, e.g. ``eagle3,eagle1,draft_lm`` (default: eagle3, eagle1, medusa1, hydrapp,
            draft_lm; for the ``smollm2`` recipe set, eagle3_31 in place of eagle3); any recipe of the chosen set,
            and ``draft_lm``.
        dtype: the dtype the target computes in (``auto``: its checkpoint's, bf16 only where this CPU has it).
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
    spec = targets.parse_target(target, dtype)
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
                _families(families, recipe_set)
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
    info = inspect_target(spec)
    resolved = targets.resolve_target(spec, path=info.dir, device=chosen.torch)  # once, for every stage
    print(
        f"  target {info.dir}: {info.model_type}, {info.layers} layers, hidden {info.hidden}, vocab {info.vocab}, "
        f"{'a' if info.chat_template else 'no'} chat template"
    )
    computed = resolved.dtype
    print(f"  dtype {computed} (--dtype {spec.dtype})")
    recipe_dir, why = _recipe_set(info, recipes)
    print(f"  recipes {recipe_dir or 'default'}: {why} (--recipes)")
    drafters, draft_lm = _families(families, recipe_dir)
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
    runs, scaled = _scaled_runs(drafters, plan, info)
    for line in scaled:
        print(f"  {line}")
    size = "sized by --hours once the target's speed is measured" if sizing else f"{budget.train_prompts}"
    print(
        f"  data: training prompts {size}, sampled at T 0.7 / top-p 0.9; {budget.score_prompts} held out greedy; "
        f"{budget.new_tokens} new tokens each (--num-prompts or --hours, --heldout, --max-new-tokens)"
    )
    record = {"pipeline": "local"}
    return run_pipeline(resolved, plan, out, budget, fast, k, runs, record=record, sizing=sizing, device=chosen)
