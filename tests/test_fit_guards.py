"""No silent dead drafter: a fit stops at its first non-finite loss or gradient in one line, keeps its last finite
checkpoint and writes none after it; resume, ``export`` and ``score`` refuse non-finite tensors; a fit whose
``val/tau_est`` never rises is said not to have learned, in its log, its result, its export, the report and
the serving advice, which never offers it.

Every fit here is the real ``fit`` of the shipped ``eagle3`` recipe on the toy target; the faults are injected by
``train_helpers.Poisoned``, the real EAGLE module whose loss (or one gradient) turns NaN from a chosen step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_train import setup  # noqa: F401  (the module's toy target and its generated data)

from draftsmith.cli import main
from draftsmith.errors import DraftsmithError
from draftsmith.eval.compare import training_table
from draftsmith.targets import resolve_target
from draftsmith.train.cli import CALLBACKS
from draftsmith.train.fit import FitRun, export_native, fit, latest_checkpoint, load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 8
"""Each fit's steps: validation (and a checkpoint) after steps 2, 4, 6 and 8."""


def run(setup, out: Path, steps: int = STEPS, resume: bool = False, lr: float | None = None) -> FitRun:  # noqa: F811
    return FitRun(
        target=str(setup["target"]), train=str(setup["data-train"]), val=str(setup["data-val"]), out=out,
        steps=steps, batch_size=4, lr=lr, model={"draft_vocab_size": 48},
        trainer={"enable_progress_bar": False}, resume=resume,
    )  # fmt: skip


def poisoned(**init) -> dict:
    """The shipped ``eagle3`` recipe with ``train_helpers.Poisoned`` as its module (``init``: its poison)."""
    recipe = load_recipe("eagle3")
    recipe["model"]["class_path"] = "train_helpers.Poisoned"
    recipe["model"]["init_args"].update(init)
    return recipe


def checkpoints(root: Path) -> dict[str, dict]:
    return {p.name: torch.load(p, weights_only=False) for p in sorted(root.glob("**/*.ckpt"))}


def finite(checkpoint: dict) -> bool:
    return all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_a_nan_loss_at_the_first_step_stops_the_fit_there_in_one_line_with_nothing_saved(setup, tmp_path):  # noqa: F811
    with pytest.raises(DraftsmithError) as e:
        fit(poisoned(from_step=0), run(setup, tmp_path / "fit"))
    line = str(e.value)
    assert "\n" not in line
    assert "stopped at step 1 of 8" in line and "loss nan" in line  # the step, the loss terms
    assert "first non-finite gradient: drafter." in line
    assert "no checkpoint was written before it" in line
    assert not checkpoints(tmp_path / "fit")


def test_a_nan_loss_at_step_k_stops_the_fit_there_keeping_the_last_finite_checkpoint(setup, tmp_path):  # noqa: F811
    """NaN from the 6th step (global_step 5): the checkpoints of steps 2 and 4 stay, the fit writes none after; the one
    line names the step, every loss term, the first parameter whose gradient is NaN and the kept checkpoint; that
    checkpoint exports and scores."""
    with pytest.raises(DraftsmithError) as e:
        fit(poisoned(from_step=5), run(setup, tmp_path / "fit"))
    line = str(e.value)
    last = latest_checkpoint(tmp_path / "fit")
    assert "\n" not in line and "stopped at step 6 of 8" in line
    assert "loss nan" in line and "ce_0 " in line  # every term: the NaN one and the finite ones
    assert "first non-finite gradient: drafter." in line
    assert f"kept {last} (after step 4)" in line
    saved = checkpoints(tmp_path / "fit")
    assert set(saved) == {"best.ckpt", "last.ckpt"}
    assert all(finite(c) and c["global_step"] <= 4 for c in saved.values())
    assert saved["last.ckpt"]["global_step"] == 4
    main(["export", str(last), "--to", "native", "--out", str(tmp_path / "native")])  # the kept one exports
    assert (tmp_path / "native" / "model.safetensors").is_file()


def test_a_nan_gradient_of_one_parameter_is_named_though_the_loss_is_finite(setup, tmp_path):  # noqa: F811
    with pytest.raises(DraftsmithError) as e:
        fit(poisoned(from_step=3, grad_of="drafter.fc.weight"), run(setup, tmp_path / "fit"))
    line = str(e.value)
    assert "stopped at step 4 of 8" in line and "first non-finite gradient: drafter.fc.weight" in line
    assert "loss nan" not in line and "non-finite gradient" in line
    assert all(finite(c) and c["global_step"] <= 2 for c in checkpoints(tmp_path / "fit").values())


def test_a_gpu_style_deferred_check_stops_at_the_next_check_naming_the_faulty_step(setup, tmp_path):  # noqa: F811
    """Where checking every step would cost a device sync (a GPU), the guard checks every ``every`` steps and
    before any checkpoint is written; the faulty step's update is not applied (its gradients are zeroed on the
    device), and the line names that step."""
    config = poisoned(from_step=4)
    guard = {"class_path": "draftsmith.layers.guard.FiniteGuard", "init_args": {"every": 8}}
    config["trainer"]["callbacks"] = [*CALLBACKS, guard]  # the fit's own checkpoints, and the guard as on a GPU
    with pytest.raises(DraftsmithError) as e:
        fit(config, run(setup, tmp_path / "fit"))
    line = str(e.value)
    assert "fit stopped after step 6 of 8 (checked every 8): step 5 had a non-finite loss" in line
    assert "loss nan" in line and "first non-finite gradient: drafter." in line
    assert f"kept {latest_checkpoint(tmp_path / 'fit')} (after step 4)" in line
    saved = checkpoints(tmp_path / "fit")  # validation at step 6 found it before writing
    assert set(saved) == {"best.ckpt", "last.ckpt"} and all(finite(c) and c["global_step"] == 4 for c in saved.values())


def poison(path: Path, out: Path) -> Path:
    """A copy of checkpoint ``path`` with one drafter tensor NaN, as a fit without the guard left it."""
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["state_dict"]["drafter.fc.weight"][0, 0] = float("nan")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out)
    return out


def test_resume_export_and_score_refuse_a_checkpoint_with_a_non_finite_tensor(setup, tmp_path, capsys):  # noqa: F811
    result = fit("eagle3", run(setup, tmp_path / "fit", steps=2))
    bad = poison(result.last, result.last)
    with pytest.raises(DraftsmithError, match=r"resume: .*last.ckpt holds non-finite values \(drafter.fc.weight"):
        fit("eagle3", run(setup, tmp_path / "fit", steps=4, resume=True))
    with pytest.raises(SystemExit) as exc:
        main(["export", str(bad), "--to", "native", "--out", str(tmp_path / "native")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert exc.value.code == 2 and len(errors) == 1 and "Traceback" not in err
    assert "non-finite" in errors[0] and "fc.weight" in errors[0] and not (tmp_path / "native").exists()
    with pytest.raises(SystemExit) as exc:
        main([
            "score", "--target", str(setup["target"]), "--drafter", f"bad={bad}", "--prompts",
            str(setup["train.jsonl"]), "--num-prompts", "1", "--out", str(tmp_path / "score"),
        ])  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exc.value.code == 2 and len(errors) == 1 and "non-finite" in errors[0] and "fc.weight" in errors[0]


def test_a_drafter_that_cannot_learn_is_flagged_in_one_line_in_its_result_and_its_export(setup, tmp_path, capsys):  # noqa: F811
    """Learning rate 0: val/tau_est stays at the untrained drafter's ~1.02; the second validation says so, the
    result and the native export record it."""
    result = fit("eagle3", run(setup, tmp_path / "fit", lr=0.0))
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "did not learn" in line]
    assert len(said) == 1 and "step 4" in said[0] and "1.05" in said[0]
    assert result.did_not_learn is not None and "1.05" in result.did_not_learn
    native = export_native(result, resolve_target(setup["target"]), tmp_path / "dead")
    assert json.loads((native / "config.json").read_text())["did_not_learn"] == result.did_not_learn
    never_served(native, setup["target"], tmp_path / "run", capsys)


def never_served(dead: Path, target: Path, out: Path, capsys) -> None:
    """The pipeline's serving advice over a drafter that did not learn: ranked, never offered, though it measured
    faster than plain decoding and than a drafter that learned (the same weights, unmarked)."""
    from test_serving import row, write_block

    from draftsmith.families.specs import Named, NGram, Trained
    from draftsmith.pipeline.serving import export_best

    alive = out / "alive"
    shutil.copytree(dead, alive)
    record = json.loads((alive / "config.json").read_text())
    (alive / "config.json").write_text(json.dumps({k: v for k, v in record.items() if k != "did_not_learn"}))
    specs = [Named("ngram", NGram()), Named("dead", Trained(str(dead))), Named("alive", Trained(str(alive)))]
    write_block(out, [row("ngram", 1.05, 1.3), row("dead", 1.4, 1.9), row("alive", 1.2, 1.7)], "k4")
    record = export_best(out, specs, target, "float32")
    options = {o["name"]: o for o in record["options"]}
    assert record["name"] == "alive" and record["serve"]["name"] == "alive" and record["beats_plain"]
    assert options["dead"]["command"] is None and options["dead"]["served"].startswith("not servable: did not learn")
    assert not (out / "export" / "dead").exists()
    specs = specs[:2]  # only the drafter that did not learn: it is no trained drafter to serve
    record = export_best(out, specs, target, "float32", blocks=[out / "score" / "k4" / "report.json"])
    assert not record["beats_plain"] and record["serve"]["name"] == "ngram" and "did not learn" in record["advice"]
    assert "Serve ngram" in record["verdict"] and record["advice"] in capsys.readouterr().out


def test_a_drafter_that_learns_is_not_flagged(setup, tmp_path, capsys):  # noqa: F811
    result = fit("eagle3", run(setup, tmp_path / "fit"))
    assert result.did_not_learn is None and "did not learn" not in capsys.readouterr().out


def test_training_table_calls_a_flat_curve_at_one_did_not_learn_not_stopped_rising():
    flat = [{"step": s, "val/tau_est": 1.0 + 0.001 * (s % 2)} for s in (19, 39, 59, 79)]
    fell = [{"step": s, "val/tau_est": v} for s, v in zip((19, 39, 59, 79), (1.4, 1.6, 1.3, 1.01), strict=True)]
    plateau = [{"step": s, "val/tau_est": v} for s, v in zip((19, 39, 59, 79), (1.4, 1.6, 1.6, 1.6), strict=True)]
    rows = {r.split("|")[1].strip(): r for r in training_table({"flat": flat, "fell": fell, "plateau": plateau})
            .splitlines()[2:]}  # fmt: skip
    assert "did not learn" in rows["flat"] and "stopped rising" not in rows["flat"]
    assert "did not learn" in rows["fell"] and "stopped rising" not in rows["fell"]
    assert "stopped rising" in rows["plateau"] and "did not learn" not in rows["plateau"]
