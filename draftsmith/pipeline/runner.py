"""The pipeline's stage runner: every stage of ``pipeline.stages`` on a resolved target as a ``Plan`` says, each
reused while its manifest records the same inputs, the libraries' logging quieted for the run."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from draftsmith import targets
from draftsmith.core.fingerprint import check_fingerprint
from draftsmith.core.machine import Device, local_device
from draftsmith.core.manifest import FILE as MANIFEST
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.eval.calibration import AUTO_K
from draftsmith.eval.compare import report
from draftsmith.eval.rows import read_rows
from draftsmith.eval.score import ScoreConfig, score_specs
from draftsmith.families.specs import Adaptive, DraftModel, Named, NGram, Trained
from draftsmith.pipeline.choices import check_families
from draftsmith.pipeline.fused import datastore, fused_spec
from draftsmith.pipeline.predict import predicted_tau
from draftsmith.pipeline.progress import Progress, duration
from draftsmith.pipeline.serving import export_best
from draftsmith.pipeline.sizing import Sizing, estimates, measure_speeds, sized_once
from draftsmith.pipeline.stages import STAGES
from draftsmith.train.fit import FitRun
from draftsmith.train.suite import Budget, Plan, make_data, train_all


def _check_out(out: Path, fingerprint: dict) -> None:
    """Refuse an output directory that holds another target's run (its ``manifest.json``)."""
    path = out / MANIFEST
    if path.is_file():
        previous = json.loads(path.read_text()).get("target")
        if previous:
            check_fingerprint(previous, fingerprint, f"--out {out} (a pipeline run)")


def run_pipeline(
    target: targets.ResolvedTarget,
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
    """The pipeline's stages on ``target`` (resolved once by the caller) as ``plan`` says; every stage takes the
    resolved target; returns the report's path. ``runs``: per family, settings on top of its recipe; ``record``: what the run's manifest records;
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
    target: targets.ResolvedTarget,
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
    target_dir = target.path
    loaded = targets.load_target(target, batch_invariant=False, device=device.torch)
    fingerprint, dtype = loaded.fingerprint, loaded.dtype
    _check_out(out, fingerprint)
    speeds = measure_speeds(loaded)
    del loaded
    if plan.drafters:
        check_families(plan, target, runs or {})
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
    guess = estimates(speeds, budget, plan, n_specs, n_blocks)
    total = sum(guess.values())
    print(f"  estimated: {', '.join(f'{n} {duration(v)}' for n, v in guess.items())} (total {duration(total)})")
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
