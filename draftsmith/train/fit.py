"""``fit(recipe, run) -> FitResult``: the one training API.

A recipe is a YAML file of ``draftsmith/configs/`` (the one recipe registry: ``eagle3``, ``smollm2/eagle3``, ...)
or any path; ``FitRun`` sets what a run changes on top of it (target, data, output dir, steps, batch size, learning
rate, and any other field by section), as typed values, never argv strings. ``draftsmith fit --config`` (the CLI
edge), the quickstart, the draft-LM stages, SLURM jobs, benchmarks and tests all train through the same
``DraftsmithCLI``, which writes the run's manifest.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.core.machine import resolve_trainer
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.core.native import save_native
from draftsmith.core.yaml_file import read_yaml
from draftsmith.errors import DraftsmithError
from draftsmith.families.registry import check_moved, load_network
from draftsmith.targets import ResolvedTarget, load_target

RECIPES = Path(__file__).resolve().parents[1] / "configs"
"""The shipped recipes (package data; the checkout's top-level ``configs`` links here)."""


def recipe_path(recipe: str | Path) -> Path:
    """A recipe file: an existing path, or a shipped recipe's name (``eagle3``, ``smollm2/eagle3``)."""
    path = Path(recipe)
    if path.is_file():
        return path
    shipped = RECIPES / f"{recipe}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(str(p.relative_to(RECIPES).with_suffix("")) for p in RECIPES.rglob("*.yaml"))
    raise DraftsmithError(
        f"recipe {str(recipe)!r}: no such file, and no shipped recipe of that name ({', '.join(names)})"
    )


def load_recipe(recipe: str | Path) -> dict:
    path = recipe_path(recipe)
    try:
        config = read_yaml(path)
    except DraftsmithError as e:
        raise DraftsmithError(f"recipe {e}") from None
    if not isinstance(config, dict) or "model" not in config:
        raise DraftsmithError(f"recipe {path}: expected a mapping with a 'model' section")
    check_moved(config, f"recipe {path}")
    return config


@dataclass(frozen=True)
class FitRun:
    """What one run sets on top of its recipe; None keeps the recipe's value."""

    target: str | None = None
    """``model.init_args.target``: a built-in target name or a model dir."""
    train: str | None = None
    """Training data dir (``data.train``)."""
    val: str | None = None
    """Validation data dir (``data.val``)."""
    features: str | None = None
    """A feature cache of the training data to train from (``data.features``)."""
    out: str | Path | None = None
    """Run directory (``trainer.default_root_dir``); emptied first unless ``resume``."""
    steps: int | None = None
    """Optimizer steps; also sets validation to every quarter, and the warm-up to a tenth of them unless the recipe gives
    it as a share (``optim.warmup_ratio``), which scales with the steps by itself."""
    batch_size: int | None = None
    """Sequences per step (``data.batch_size``)."""
    lr: float | None = None
    """Peak learning rate (``model.init_args.optim.lr``)."""
    model: dict = field(default_factory=dict)
    """Further ``model.init_args`` values (nested dicts merge)."""
    data: dict = field(default_factory=dict)
    """Further data-module arguments."""
    trainer: dict = field(default_factory=dict)
    """Further ``trainer`` values."""
    resume: bool = False
    """Keep an existing run directory and continue from its newest ``last.ckpt`` when it has one (optimizer,
    schedule, mid-epoch data position: an interrupted fit loses at most the steps since its last checkpoint, a
    validation's or ``TimedLastCheckpoint``'s of every 10 minutes)."""


@dataclass(frozen=True)
class FitResult:
    """Where a fit left its checkpoints."""

    root: Path
    """The run directory (logs, checkpoints, ``manifest.json``, ``config.yaml``)."""
    best: Path
    """The best checkpoint by the monitored metric (``val/tau_est`` unless the recipe says otherwise)."""
    score: float | None
    """Its monitored metric."""
    last: Path | None
    """The last checkpoint (for resuming)."""
    did_not_learn: str | None = None
    """Why its ``val/tau_est`` says the drafter did not learn (``layers.estimate.did_not_learn``; the fit said so
    in one line), or None. The native export records it and the pipeline never offers such a drafter for serving."""


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _given(values: dict) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def _init_args(section: dict) -> dict:
    """The arguments of a ``{class_path, init_args}`` section, or the section itself when it is plain."""
    return section.setdefault("init_args", {}) if "class_path" in section else section


def configure(recipe: str | Path | dict, run: FitRun = FitRun()) -> dict:
    """The recipe's config with ``run`` applied and the device's choices made (``accelerator: auto``, ``devices:
    auto``, ``precision`` unset: ``core.machine.resolve_trainer``): what ``fit`` hands to Lightning."""
    config = copy.deepcopy(recipe) if isinstance(recipe, dict) else load_recipe(recipe)
    model = _init_args(config["model"])
    data = _init_args(config.setdefault("data", {}))
    trainer = config.setdefault("trainer", {})
    set_model = {"target": run.target} | ({"optim": {"lr": run.lr}} if run.lr is not None else {})
    set_data = {"train": run.train, "val": run.val, "features": run.features, "batch_size": run.batch_size}
    set_trainer = {"default_root_dir": str(run.out) if run.out is not None else None}
    if run.steps is not None:
        if not model.get("optim", {}).get("warmup_ratio"):  # a share scales with the steps by itself
            set_model["optim"] = set_model.get("optim", {}) | {"warmup_steps": max(1, run.steps // 10)}
        set_trainer |= {"max_steps": run.steps, "max_epochs": -1, "val_check_interval": max(1, run.steps // 4)}
    model.update(_merge(model, _given(set_model) | run.model))
    data.update(_merge(data, _given(set_data) | run.data))
    trainer.update(_merge(trainer, _given(set_trainer) | run.trainer))
    if run.steps is not None:  # validate by steps, not epochs (None is the value here)
        trainer["check_val_every_n_epoch"] = None
    trainer.update(resolve_trainer(trainer))
    return config


IN_PROCESSES = "DRAFTSMITH_FIT_PROCESSES"
"""Set in the processes of a fit that ``fit`` runs as its own command (``fit_in_processes``)."""


def fit(recipe: str | Path | dict, run: FitRun = FitRun()) -> FitResult:
    """Train the recipe's drafter with ``run`` applied; returns where its checkpoints are. A fit on several devices
    (every local GPU, ``core.machine.choose_device``) runs as its own command (``fit_in_processes``)."""
    config = configure(recipe, run)
    root = Path(config["trainer"].get("default_root_dir") or ".")
    if not run.resume and root != Path("."):
        shutil.rmtree(root, ignore_errors=True)
    last = latest_checkpoint(root) if run.resume else None
    if last is not None:
        print(f"fit {root}: resuming from {last}")
        config["ckpt_path"] = str(last)
    name = None if isinstance(recipe, dict) else str(recipe_path(recipe))
    trainer = config["trainer"]
    if (trainer.get("devices") not in (1, "1") or trainer.get("num_nodes", 1) != 1) and IN_PROCESSES not in os.environ:
        return fit_in_processes(config, name, root)
    return fit_config(config, name)


def fit_in_processes(config: dict, recipe: str | None, root: Path) -> FitResult:
    """``fit_config`` as its own command (``python -m draftsmith.train.fit``), whose Lightning launches one process per
    device by running that command again: run in this process, Lightning would launch this process's command again
    (the pipeline's, a benchmark's) on every other device."""
    root.mkdir(parents=True, exist_ok=True)
    given, result = root / "fit_config.json", root / "fit_result.json"
    given.write_text(json.dumps({"config": config, "recipe": recipe}))
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "draftsmith.train.fit", str(given), str(result)]
    done = subprocess.run(command, env={**os.environ, IN_PROCESSES: "1"})
    answer = json.loads(result.read_text()) if result.is_file() else {}
    if "error" in answer or done.returncode != 0 or not answer:
        raise DraftsmithError(
            answer.get("error") or f"fit {root}: its processes failed (exit {done.returncode}; their output is above)"
        )
    return FitResult(**{k: Path(v) if k in ("root", "best", "last") and v else v for k, v in answer.items()})


def fit_config(config: dict, recipe: str | None = None) -> FitResult:
    """Train a configured recipe (``configure``'s) in this process; ``recipe``: recorded in the manifest."""
    from draftsmith.layers.guard import FiniteGuard
    from draftsmith.train.cli import fit_main

    root = Path(config["trainer"].get("default_root_dir") or ".")
    cli = fit_main(config, recipe=recipe)
    best = cli.trainer.checkpoint_callback
    if best is None or not best.best_model_path:
        raise DraftsmithError(f"fit {root}: no checkpoint was saved (does the recipe validate before it stops?)")
    score = float(best.best_model_score) if best.best_model_score is not None else None
    guard = next((c for c in cli.trainer.callbacks if isinstance(c, FiniteGuard)), None)
    return FitResult(
        root,
        Path(best.best_model_path),
        score,
        Path(best.last_model_path) if best.last_model_path else None,
        guard.did_not_learn if guard is not None else None,
    )


def latest_checkpoint(root: Path) -> Path | None:
    """The newest ``last.ckpt`` a fit left under ``root`` (each restart logs into a new version dir)."""
    found = sorted(Path(root).glob("**/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def export_native(result: FitResult, target: ResolvedTarget, out: str | Path, stage: dict | None = None) -> Path:
    """The fit's best checkpoint as a native drafter dir, recording the checkpoint, its ``val_tau_est``, the
    top-k accuracies static trees are built from and, if so, why it ``did_not_learn``; ``stage``: the inputs
    recorded for ``is_current``."""
    target_obj = load_target(target)
    network, info = load_network(result.best, target_obj)
    extra = {"checkpoint": str(result.best), "val_tau_est": result.score}
    if info.get("topk_accuracy"):
        extra["topk_accuracy"] = info["topk_accuracy"]
    if result.did_not_learn:
        extra["did_not_learn"] = result.did_not_learn
    save_native(network, target_obj, out, extra)
    write_manifest(out, target=target_obj.fingerprint, stage=stage, checkpoint=str(result.best))
    return Path(out)


def fit_export(recipe: str | Path, run: FitRun, target: ResolvedTarget, out: str | Path, force: bool = False) -> Path:
    """``fit`` then ``export_native`` to ``out``, unless ``out`` is current: exported from the same resolved config
    (``core.manifest.is_current``)."""
    stage = {"fit": configure(recipe, run)}
    if not force and is_current(out, stage):
        return Path(out)
    return export_native(fit(recipe, run), target, out, stage)


if __name__ == "__main__":  # fit_in_processes's command: CONFIG_JSON RESULT_JSON; every process of the fit runs it
    from draftsmith.train.cli import fit_main

    given = json.loads(Path(sys.argv[1]).read_text())
    if os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0":
        fit_main(given["config"], recipe=given["recipe"])
    else:  # rank 0 says how the fit ended, its one-line refusal included
        try:
            answer = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(fit_config(**given)).items()}
        except DraftsmithError as e:
            answer = {"error": str(e)}
        Path(sys.argv[2]).write_text(json.dumps(answer))
