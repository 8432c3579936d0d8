"""Train every family on one target: on-policy data, the feature cache, each family from its recipe, the
distilled draft LM and the acceptance head. The quickstart and the real-target benchmark run it.

Recipes are the one recipe registry: a ``Plan`` names the recipe directory of its target (``configs/`` for the
embedded default target, ``configs/smollm2/`` for SmolLM2); their ``trainer.max_steps`` are the budgets, scaled by
``Budget.fit_scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from draftsmith.core.machine import Device, local_device
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.data.engines import generation_engine
from draftsmith.data.stage import generated_once
from draftsmith.families.draft_lm import train as draft_lm
from draftsmith.targets import ResolvedTarget
from draftsmith.train.fit import FitRun, fit_export, load_recipe


@dataclass(frozen=True)
class Budget:
    """How much work each stage does."""

    train_prompts: int = 600
    """Built-in training prompts the target continues (sampled)."""
    new_tokens: int = 48
    """Tokens the target generates per prompt, for data and for scoring."""
    score_prompts: int = 10
    """Held-out prompts: greedy validation data and the verifier's scoring set (the same prompts)."""
    fit_scale: float = 1.0
    """Each recipe's ``trainer.max_steps`` times this (at least 2)."""
    fit_steps: int = 0
    """> 0: every family trains this many optimizer steps (times ``fit_scale``) instead of its recipe's
    ``max_steps``: equal steps, so the families are compared on the same budget."""
    epochs: float = 0.0
    """> 0 (and no ``fit_steps``): each family trains at least this many passes over the training rows (its recipe's
    ``max_steps`` the floor), so a larger corpus is trained on whole (the recipe study's 2)."""
    batch_size: int = 8
    """Training sequences per step."""
    head_prompts: int = 200
    """Built-in training prompts the target continues greedily for the acceptance head."""
    head_steps: int = 50
    """Acceptance head optimizer steps."""


FULL = Budget()
FAST = Budget(train_prompts=48, new_tokens=24, score_prompts=4, fit_scale=0.12, batch_size=4, head_prompts=16)


@dataclass(frozen=True)
class Plan:
    """What is trained on one target, from which prompts and recipes."""

    budget: Budget
    """Work per stage."""
    recipes: str = ""
    """Recipe directory under ``configs/`` (``""``: the default target's, ``"smollm2"``)."""
    drafters: tuple[str, ...] = ("eagle3", "eagle1", "medusa1", "hydrapp")
    """The families trained from their recipes, in order (Hydra and Medusa-2 are in ``benchmarks/heads.py``)."""
    prompts: tuple[str, str] = ("builtin:train", "builtin:heldout")
    """Training and held-out (scoring) prompt sets."""
    temperature: float = 1.0
    """Sampling temperature of the training data (validation data is greedy)."""
    top_p: float = 1.0
    """Nucleus mass of the training data."""
    ks: tuple[int, ...] = (2, 4, 6)
    """Draft lengths scored (the main table's K is always among them)."""
    features: bool = False
    """Cache the target's hidden states over the training data once (``data/train-features``) and train the
    feature drafters from it instead of running the target in every step."""
    acceptance_head: bool = True
    """Train a SpecDec++ acceptance head on EAGLE-1 (scored as ``eagle1-adaptive``)."""
    draft_lm_layers: int = 0
    """> 0: the draft LM starts as the target's first N layers with its own embeddings, norm and head
    (``truncated_target``); 0: the target's sibling when it has one, else a fresh student pre-trained on the corpus."""
    dtype: str = "auto"
    """The dtype the target computes in for data, features, training and scoring (``targets.TargetSpec``; ``auto``:
    its checkpoint's)."""
    draft_lm: bool = True
    """Distil a draft LM too (``drafters/draft_lm``)."""

    def recipe(self, name: str) -> str:
        return f"{self.recipes}/{name}" if self.recipes else name

    def target(self, target_dir: Path) -> str:
        """The target spec every stage loads: ``target_dir`` in this plan's dtype."""
        return str(target_dir) if self.dtype == "auto" else f"{target_dir}:{self.dtype}"


SMOLLM2 = Plan(
    # 30-layer target at ~12 tokens/s greedy on 2 CPU cores: data ~5 min, training ~35 min, scoring ~7 min
    budget=Budget(train_prompts=400, new_tokens=64, score_prompts=8, batch_size=8, head_prompts=96),
    recipes="smollm2",
    prompts=("builtin:chat-train", "builtin:chat-heldout"),
    temperature=0.7,
    top_p=0.9,
    ks=(4,),
    features=True,
    draft_lm_layers=2,
)
DEMO = Plan(replace(FULL, fit_steps=180))
"""``make demo``'s plan on the ``demo`` target: the default recipes, every family at the same number of steps."""
PLANS = {"demo": DEMO, "default": Plan(FULL), "smollm2": SMOLLM2}
"""The built-in targets' plans."""


def make_data(
    target: ResolvedTarget,
    out: Path,
    budget: Budget,
    plan: Plan = PLANS["default"],
    device: Device | None = None,
) -> tuple[Path, Path]:
    """Sampled training data on built-in prompts, greedy validation data on the held-out scoring prompts, generated
    on ``device`` (default: this machine's, ``core.machine.local_device``)."""
    device = device or local_device()
    sampled = {"temperature": plan.temperature} | ({"top_p": plan.top_p} if plan.top_p < 1 else {})
    runs = {
        "train": {"prompts": plan.prompts[0], **sampled, "num_prompts": budget.train_prompts},
        "val": {"prompts": plan.prompts[1], "temperature": 0.0, "num_prompts": budget.score_prompts},
    }
    runs = {name: settings | _dtype(plan) for name, settings in runs.items()}
    engine = generation_engine(device.torch)
    return tuple(
        generated_once(
            target, out / "data" / name, {**settings, "max_new_tokens": budget.new_tokens}, device.torch, engine
        )
        for name, settings in runs.items()
    )


def make_head_data(
    target: ResolvedTarget,
    out: Path,
    budget: Budget,
    plan: Plan = PLANS["default"],
    device: Device | None = None,
) -> Path:
    """Greedy continuations of built-in training prompts (``data/head``) for the acceptance head: greedy
    verification runs along the target's greedy text, so that is the text whose acceptances it must predict."""
    settings = {"prompts": plan.prompts[0], "temperature": 0.0, "num_prompts": budget.head_prompts} | _dtype(plan)
    device = (device or local_device()).torch
    return generated_once(
        target,
        out / "data" / "head",
        {**settings, "max_new_tokens": budget.new_tokens},
        device,
        generation_engine(device),
    )


def _dtype(plan: Plan) -> dict:
    """``generate``'s dtype setting for ``plan`` (none for ``auto``, so earlier manifests stay current)."""
    return {} if plan.dtype == "auto" else {"dtype": plan.dtype}


def recipe_steps(recipe: str, budget: Budget) -> int:
    """The recipe's ``trainer.max_steps`` (the budget's ``fit_steps`` where it sets them; at least ``epochs`` passes
    over the training prompts where the budget sets them) scaled by the budget."""
    steps = budget.fit_steps or load_recipe(recipe)["trainer"]["max_steps"]
    if budget.epochs > 0 and not budget.fit_steps:
        steps = max(steps, math.ceil(budget.epochs * budget.train_prompts / budget.batch_size))
    return max(2, round(steps * budget.fit_scale))


def train_drafter(
    recipe: str,
    target: ResolvedTarget,
    data: tuple[Path, Path],
    out: Path,
    budget: Budget,
    name: str | None = None,
    force: bool = False,
    features: Path | None = None,
    run: FitRun | None = None,
    device: Device | None = None,
) -> Path:
    """Fit ``recipe`` (its steps scaled by ``budget``) on ``data`` (train, val) and export its best checkpoint by
    ``val/tau_est`` to ``out/drafters/<name>`` (default: the recipe's name); an export of the same resolved config is
    reused unless ``force``. ``features``: a feature cache of the training data to train from; ``run``: further settings;
    ``device``: where it trains (default: the recipe's ``auto``, this machine's)."""
    name, run = name or Path(recipe).stem, run or FitRun()
    steps = run.steps or recipe_steps(recipe, budget)
    return fit_export(
        recipe,
        FitRun(
            target=str(target),  # the fit's config carries it as DIR:DTYPE (``layers.module.config_target``)
            train=str(data[0]),
            val=str(data[1]),
            features=str(features) if features else None,
            out=out / "fit" / name,
            steps=steps,
            batch_size=budget.batch_size,
            lr=run.lr,
            model=run.model,
            data=run.data,
            trainer={"enable_model_summary": False} | (device.trainer() if device else {}) | run.trainer,
        ),
        target,
        out / "drafters" / name,
        force,
    )


def train_acceptance_head(
    target: ResolvedTarget,
    drafter: Path,
    data: tuple[Path, Path],
    out: Path,
    budget: Budget,
    device: Device | None = None,
) -> Path:
    """A SpecDec++ acceptance head on ``drafter`` (``drafters/<drafter>-head``), trained on ``data`` (train,
    val); reused when current.

    Scored as ``adaptive:0.5:HEAD``: K is the most it drafts; it stops once a rejection among the tokens
    drafted so far is predicted more likely than not (``benchmarks/adaptive.py``: 0.3 and 0.5 within 1%).
    """
    from draftsmith.families.acceptance_head.train import train_head

    export = out / "drafters" / f"{drafter.name}-head"
    steps = max(10, round(budget.head_steps * budget.fit_scale))
    stage = {"acceptance_head": str(drafter), "target": str(target), "data": data, "steps": steps}
    if is_current(export, stage):
        return export
    path, _ = train_head(str(target), str(drafter), str(data[0]), str(data[1]), export, max_steps=steps, device=device)
    write_manifest(path, stage=stage)
    return path


def train_all(
    target: ResolvedTarget,
    data: tuple[Path, Path],
    out: Path,
    budget: Budget,
    plan: Plan,
    fast: bool = False,
    runs: dict[str, FitRun] | None = None,
    device: Device | None = None,
) -> dict[str, Path]:
    """Train every family of ``plan`` (each reused when exported already); returns name -> native dir,
    the acceptance head as ``eagle1-head``. ``runs``: per family, settings on top of its recipe; ``device``: where
    the feature cache and every fit run (default: this machine's, ``core.machine.local_device``)."""
    trained, features, runs, device = {}, None, runs or {}, device or local_device()
    if plan.features:
        from draftsmith.data.feature_cache import eagle3_features

        print("  the target's hidden states over the training data (feature cache)")
        features = eagle3_features(target, data[0], device=device.torch)
    for name in plan.drafters:
        recipe = plan.recipe(name)
        print(f"  {name} ({recipe_steps(recipe, budget)} steps, recipe {recipe})")
        trained[name] = train_drafter(
            recipe, target, data, out, budget, name=name, features=features, run=runs.get(name), device=device
        )
    if plan.draft_lm:
        trained["draft_lm"] = _draft_lm(target, data, out, plan, fast, device)
    if plan.acceptance_head:
        print("  eagle1 acceptance head (SpecDec++)")
        head_data = (make_head_data(target, out, budget, plan, device), data[1])
        trained["eagle1-head"] = train_acceptance_head(target, trained["eagle1"], head_data, out, budget, device)
    return trained


def _draft_lm(
    target: ResolvedTarget, data: tuple[Path, Path], out: Path, plan: Plan, fast: bool, device: Device
) -> Path:
    """The distilled draft LM of ``plan`` (``drafters/draft_lm``), from the target's first layers, its sibling or a
    student pre-trained on the corpus."""
    target_dir = target.path
    if plan.draft_lm_layers:
        init = draft_lm.truncated_target(target_dir, plan.draft_lm_layers, out / "drafters" / "draft_lm_init")
        what = f"the target's first {plan.draft_lm_layers} layers with its embeddings, norm and head"
    else:
        init = target_dir / "sibling" if (target_dir / "sibling").is_dir() else None
        what = "the target's sibling, pre-trained on its corpus" if init else "a student pre-trained on the corpus"
    print(f"  draft_lm (DistillSpec on-policy distillation of {what})")
    lm_budget = draft_lm.FAST if fast else draft_lm.QUICK
    return draft_lm.train_distilled_draft_lm(target, data, out, lm_budget, init=init, device=device)
