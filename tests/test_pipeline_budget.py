"""``draftsmith pipeline``'s data budget sized by time (``--hours``), and the τ its learning curve predicts."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.choices import LARGE, choose_families
from draftsmith.pipeline.local import pipeline
from draftsmith.pipeline.predict import predicted_tau
from draftsmith.pipeline.sizing import EPOCHS, Sizing, Speeds, estimates, passes, size_budget, sized_once
from draftsmith.targets import ResolvedTarget, TargetSpec
from draftsmith.train.fit import RECIPES, load_recipe
from draftsmith.train.suite import Budget, Plan, recipe_steps

SPEEDS = Speeds(step_s=0.05, batch_step_s=0.2, forward_tokens_s=2000.0)
PLAN = Plan(Budget(), recipes="smollm2", drafters=("eagle3", "eagle1"), features=True)


def seconds(budget: Budget) -> float:
    return sum(estimates(SPEEDS, budget, replace(PLAN, budget=budget), 5, 2).values())


def test_the_budget_is_the_most_prompts_that_fit_the_hours():
    budget = size_budget(Sizing(1.0, 100_000), SPEEDS, PLAN.budget, PLAN, 5, 2)
    n = budget.train_prompts
    assert 48 < n < 100_000 and budget.epochs == EPOCHS and budget.fit_steps == 0
    assert seconds(budget) <= 3600 < seconds(replace(budget, train_prompts=n + 1))  # the largest that fits
    # each family then makes EPOCHS passes over the prompts, its recipe's steps the floor
    steps = math.ceil(EPOCHS * n / budget.batch_size)
    assert recipe_steps("smollm2/eagle3", budget) == max(steps, load_recipe("smollm2/eagle3")["trainer"]["max_steps"])
    # twice the time buys more prompts; a set smaller than what fits is taken whole
    assert size_budget(Sizing(2.0, 100_000), SPEEDS, PLAN.budget, PLAN, 5, 2).train_prompts > n
    assert size_budget(Sizing(1.0, 300), SPEEDS, PLAN.budget, PLAN, 5, 2).train_prompts == 300


def test_the_smollm2_recipe_set_makes_the_passes_its_study_measured_to_pay_and_the_hours_buy_fewer_prompts():
    assert passes("smollm2") == 4.0 and passes("") == EPOCHS == 2.0 and passes("runs/my-recipes") == EPOCHS
    # the CLI's --hours help (the pipeline's docstring) states the same passes
    assert f"passes over them: {passes(LARGE):g} for ``{LARGE}``, else {EPOCHS:g})" in " ".join(
        pipeline.__doc__.split()
    )
    two = size_budget(Sizing(1.0, 100_000), SPEEDS, replace(PLAN.budget, epochs=2.0), PLAN, 5, 2)
    four = size_budget(Sizing(1.0, 100_000), SPEEDS, replace(PLAN.budget, epochs=passes("smollm2")), PLAN, 5, 2)
    assert (two.epochs, four.epochs) == (2.0, 4.0) and four.train_prompts < two.train_prompts
    assert recipe_steps("smollm2/eagle3_31", four) == max(100, math.ceil(4.0 * four.train_prompts / four.batch_size))


def test_hours_too_short_for_the_smallest_budget_are_refused_in_one_line():
    with pytest.raises(DraftsmithError, match=r"^--hours 0.001: even 48 training prompts need ~\d+ (s|min) on this"):
        size_budget(Sizing(0.001, 1000), SPEEDS, PLAN.budget, PLAN, 5, 2)


def size(out: Path, budget: Budget, plan: Plan = PLAN, speeds: Speeds = SPEEDS) -> Budget:
    """The budget a run into ``out`` sizes for an hour of ``plan`` (its budget ``budget``) at ``speeds``."""
    return sized_once(out, Sizing(1.0, 100_000), speeds, budget, replace(plan, budget=budget), 5, 2)


def test_a_sized_budget_is_kept_only_while_every_input_of_its_estimate_is_the_same(tmp_path, capsys):
    first = size(tmp_path / "run", PLAN.budget)
    assert "by this machine's measured speed" in capsys.readouterr().out
    # the same run made again: the speed measured anew is a little slower, the data made for the first choice stays
    slower = Speeds(SPEEDS.step_s * 1.03, SPEEDS.batch_step_s * 1.03, SPEEDS.forward_tokens_s / 1.03)
    assert size_budget(Sizing(1.0, 100_000), slower, PLAN.budget, PLAN, 5, 2).train_prompts < first.train_prompts
    assert size(tmp_path / "run", PLAN.budget, speeds=slower) == first and "as chosen before" in capsys.readouterr().out
    # any other input of the estimate sizes anew (the issue: a run sized at 48 new tokens, made again at 512, kept its
    # prompts and would have taken ~10x its hour)
    changed = {
        "256 new tokens": (replace(PLAN.budget, new_tokens=256), PLAN, SPEEDS),
        "one family fewer": (PLAN.budget, replace(PLAN, drafters=("eagle3",)), SPEEDS),
        "no draft LM": (PLAN.budget, replace(PLAN, draft_lm=False), SPEEDS),
        "batch 16": (replace(PLAN.budget, batch_size=16), PLAN, SPEEDS),
        "4 passes": (replace(PLAN.budget, epochs=4.0), PLAN, SPEEDS),
        "no feature cache": (PLAN.budget, replace(PLAN, features=False), SPEEDS),
        "a machine 1.5x slower": (PLAN.budget, PLAN, Speeds(0.075, 0.3, 2000.0 / 1.5)),
    }
    for why, (budget, plan, speeds) in changed.items():
        out = tmp_path / why
        size(out, PLAN.budget)
        capsys.readouterr()
        again = size(out, budget, plan, speeds)
        assert "as chosen before" not in capsys.readouterr().out, why
        fresh = size_budget(Sizing(1.0, 100_000), speeds, budget, replace(plan, budget=budget), 5, 2)
        assert again == fresh and again.train_prompts != first.train_prompts, why
        assert json.loads((out / "sizing.json").read_text())["train_prompts"] == again.train_prompts, why
    long = size(tmp_path / "256 new tokens", replace(PLAN.budget, new_tokens=256))
    assert long.train_prompts < first.train_prompts / 4
    # the user's own recipe set: a family's recipe given more steps than the passes make sizes anew
    mine = tmp_path / "recipes"
    mine.mkdir()
    for name in PLAN.drafters:
        (mine / f"{name}.yaml").write_text((RECIPES / "smollm2" / f"{name}.yaml").read_text())
    plan = replace(PLAN, recipes=str(mine))
    before = size(tmp_path / "own", PLAN.budget, plan)
    recipe = load_recipe(mine / "eagle3.yaml")
    recipe["trainer"]["max_steps"] = 1500
    (mine / "eagle3.yaml").write_text(yaml.safe_dump(recipe))
    capsys.readouterr()
    after = size(tmp_path / "own", PLAN.budget, plan)
    assert "as chosen before" not in capsys.readouterr().out and after.train_prompts < before.train_prompts


def test_the_learning_curve_predicts_tau_for_the_target_it_was_measured_on():
    record = json.loads((RECIPES / "smollm2" / "learning_curve.json").read_text())
    assert record["target"].startswith("smollm2") and record["k"] == 4
    smollm2 = ResolvedTarget(TargetSpec("smollm2"), Path("unused"), "bfloat16")
    plan = replace(PLAN, budget=replace(PLAN.budget, epochs=2.0), drafters=("eagle3_31", "eagle1"))
    text = predicted_tau(plan, smollm2, 1_000_000)
    assert text.startswith("τ at K = 4 predicted for 1,000,000 generated tokens and 2 passes over them: ")
    # the recipe study's curve (250k-1M) and the data-scaling study's (22k-1M), each named with its measured range
    assert "eagle3_31 " in text and "(within the measured 250,000–1,000,000; " in text
    assert "eagle1 " in text and "(within the measured 22,000–1,000,000; " in text
    assert "medusa1" not in text  # only the families the run trains
    # passes no curve measured: said so per family, not predicted from another number of passes
    five = predicted_tau(replace(plan, budget=replace(plan.budget, epochs=5.0)), smollm2, 1_000_000)
    assert "eagle1: measured at 2 passes, not at this run's 5" in five and "eagle1 " not in five
    assert predicted_tau(PLAN, smollm2, 1_000_000).startswith("no learning curve for a run of its recipes' own steps")
    # another target with the same recipe set: no prediction, said so
    other = ResolvedTarget(TargetSpec("runs/my-model"), Path("runs/my-model"), "float32")
    assert predicted_tau(plan, other, 1_000_000).startswith("no learning curve measured for this target")
    assert predicted_tau(replace(plan, recipes=""), smollm2, 1_000_000).startswith("no learning curve measured")
    assert predicted_tau(replace(plan, drafters=("medusa1",)), smollm2, 1_000_000).startswith("no learning curve")


def curve_set(tmp_path: Path, sets: dict[str, dict]) -> Plan:
    """A plan on a recipe set of ``tmp_path`` whose learning curve (SmolLM2's, K = 4) is EAGLE-1's ``sets`` at 2
    passes, measured from 1,000 to 1,000,000 generated tokens."""
    curve = {"family": "eagle1", "epochs": 2.0, "tokens": [1000, 1_000_000], "source": "a study", "sets": sets}
    record = {"target": "smollm2:bfloat16", "k": 4, "curves": [curve]}
    (tmp_path / "learning_curve.json").write_text(json.dumps(record))
    return replace(PLAN, recipes=str(tmp_path), budget=replace(PLAN.budget, epochs=2.0), drafters=("eagle1",))


SMOLLM2 = ResolvedTarget(TargetSpec("smollm2"), Path("unused"), "bfloat16")


def test_the_predicted_tau_is_never_below_one_a_round_commits_at_least_its_target_token(tmp_path):
    plan = curve_set(tmp_path, {"rising": {"a": 0.5, "b": 0.1}, "low": {"a": -1.0, "b": 0.1}})
    # at e^10 tokens (22,026) the curves read 0.5 + 1.0 = 1.50 and -1 + 1.0 = 0: the latter is impossible
    text = predicted_tau(plan, SMOLLM2, 22_026)
    assert "eagle1 1.50 rising / 1.00 low (within the measured 1,000–1,000,000; a study)" in text


@pytest.mark.parametrize("tokens", [10, 999, 1_000_001, 50_000_000])
def test_outside_the_curves_measured_range_the_prediction_is_refused_not_extrapolated(tmp_path, tokens):
    plan = curve_set(tmp_path, {"rising": {"a": 0.5, "b": 0.1}})
    text = predicted_tau(plan, SMOLLM2, tokens)
    assert f"eagle1: no prediction for {tokens:,} tokens, outside the measured 1,000–1,000,000 (a study)" in text
    assert not re.search(r"\d\.\d\d rising", text)


def test_the_shipped_curves_predict_no_tau_below_one_and_none_for_the_default_smollm2_runs_data():
    """The issue's run: 48 prompts of 256 new tokens printed ``eagle3_31 0.56 mt-bench / 0.18 chat-heldout``."""
    plan = replace(PLAN, budget=replace(PLAN.budget, epochs=passes(LARGE)), drafters=("eagle3_31",))
    text = predicted_tau(plan, SMOLLM2, 48 * 256)
    assert "eagle3_31: no prediction for 12,288 tokens, outside the measured 250,000–1,000,000" in text
    for passes_ in (2.0, 4.0):
        plan = replace(PLAN, budget=replace(PLAN.budget, epochs=passes_), drafters=("eagle3_31", "eagle1", "eagle3"))
        for tokens in (10_000, 22_000, 50_000, 250_000, 400_000, 1_000_000, 3_000_000):
            taus = [
                float(t)
                for t in re.findall(r"(\d+\.\d\d) (?:mt-bench|chat-heldout)", predicted_tau(plan, SMOLLM2, tokens))
            ]
            assert all(t >= 1.0 for t in taus), (passes_, tokens, taus)


@pytest.mark.parametrize(("flag", "value"), [("--hours", "0"), ("--num-prompts", "0")])
def test_a_budget_that_is_not_positive_is_one_line_before_any_target_is_built(flag, value, tmp_path, capsys):
    from draftsmith.cli import main

    with pytest.raises(SystemExit):
        main(
            ["pipeline", "--target", "default", "--prompts", "builtin:train", flag, value, "--out", str(tmp_path / "r")]
        )
    err = capsys.readouterr().err.strip()
    assert err == f"draftsmith: error: {flag} must be positive, got {value}"
    assert not (tmp_path / "r").exists()


def test_the_large_recipe_sets_default_is_the_recipe_studys_winner_which_differs_from_eagle3_by_its_norms():
    large, distils = choose_families(None, LARGE)
    assert large[0] == "eagle3_31" and "eagle3" not in large and distils
    assert choose_families(None, "")[0][0] == "eagle3"  # the toy target's set: its own EAGLE-3
    assert choose_families(["eagle3"], LARGE)[0] == ["eagle3"]  # still there when asked for

    def place(recipe: dict, key: str) -> tuple[dict, str]:
        """The dict holding ``key`` (``trainer.X``, ``optim.X``, else a model argument) and its last name."""
        *path, name = key.split(".")
        where = recipe if path[:1] == ["trainer"] else recipe["model"]["init_args"]
        for part in path:
            where = where.get(part, {})
        return where, name

    def without(name: str, *keys: str) -> dict:
        recipe = load_recipe(f"smollm2/{name}")
        for key in keys:
            where, last = place(recipe, key)
            where.pop(last, None)
        del recipe["trainer"]["default_root_dir"]
        return recipe

    # the study's rows differ only by what they test: the winner is EAGLE-3's recipe with EAGLE-3.1's two norms
    assert without("eagle3_31", "fc_norm", "norm_output") == without("eagle3")
    assert without("eagle3_lk", "loss", "lk_eta") == without("eagle3")
    # the rows over the winner (configs/smollm2/study/), each EAGLE-3.1's recipe with one change
    changes = {
        "eagle3_31_lk": ("loss", "lk_eta"),
        "eagle3_31_2l": ("num_layers",),
        "eagle3_31_ttt7": ("ttt_steps",),
        "eagle3_31_nodecay": ("step_decay",),
        "eagle3_31_16k": ("draft_vocab_size",),
        "eagle3_31_clip": ("trainer.gradient_clip_val",),
        "eagle3_31_cos0": ("optim.min_lr_ratio",),
        "eagle3_31_warm1pct": ("optim.warmup_steps", "optim.warmup_ratio"),
        "eagle3_31_lr1e3": ("optim.lr",),
        "eagle3_31_b2": ("optim.betas",),
        "eagle3_31_headrand": ("head_init",),
    }
    assert {p.stem for p in (RECIPES / "smollm2" / "study").glob("*.yaml")} == set(changes)
    for row, keys in changes.items():
        assert without(f"study/{row}", *keys) == without("eagle3_31", *keys), row
        changed, base = load_recipe(f"smollm2/study/{row}"), load_recipe("smollm2/eagle3_31")
        assert all(
            place(changed, k)[0].get(place(changed, k)[1]) != place(base, k)[0].get(place(base, k)[1]) for k in keys
        ), row
