"""The data budget sized by time (``--hours``): the target's speed measured on this machine (``measure_speeds``),
each stage's time estimated from it (``estimates``), and the most training prompts whose stages fit the hours
(``size_budget``), chosen once per run directory (``sized_once``)."""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from draftsmith.core.hf_cache import cache_arg, output_cache
from draftsmith.errors import DraftsmithError
from draftsmith.eval.calibration import verify_ratios
from draftsmith.pipeline.choices import LARGE
from draftsmith.pipeline.progress import duration
from draftsmith.train.fit import load_recipe
from draftsmith.train.suite import Budget, Plan, recipe_steps


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


def estimates(speeds: Speeds, budget: Budget, plan: Plan, n_specs: int, n_blocks: int) -> dict[str, float]:
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
    estimated stages (``estimates``) fit ``sizing.hours``, each family fitting the budget's passes over them (its
    recipe's steps the floor). Refused in one line when even the smallest does not fit."""
    limit, smallest = sizing.hours * 3600, min(SMALLEST, sizing.available)
    if _seconds(smallest, speeds, budget, plan, n_specs, n_blocks) > limit:
        need = duration(_seconds(smallest, speeds, budget, plan, n_specs, n_blocks))
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
    return sum(estimates(speeds, b, replace(plan, budget=b), n_specs, n_blocks).values())


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
