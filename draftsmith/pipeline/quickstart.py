"""``draftsmith quickstart``: the whole pipeline on a built-in target (``default``: the embedded toy; ``smollm2``:
SmolLM2-135M-Instruct, a real pretrained LLM; see ``PLANS``).

Stages (each one's artifact under ``out`` is reused while its manifest records the same inputs, so a re-run is fast):
target → on-policy data (``data/train`` sampled, ``data/val`` greedy on held-out prompts)
→ train EAGLE-3, EAGLE-1, Medusa-1 and Hydra++ (``fit/<name>``, best checkpoint exported to
``drafters/<name>``), a distilled draft LM (``drafters/draft_lm``) and a SpecDec++ acceptance
head on EAGLE-1 (``drafters/eagle1-head``)
→ score every drafter and the baselines with the verifier at K = 2, 4, 6 (``score/k<K>``)
→ export the fastest trained drafter at K for serving (``export/<name>``, the engine format its family has)
→ the comparison report with plots (``report/``).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import transformers

from draftsmith import targets
from draftsmith.core.manifest import is_current, write_manifest
from draftsmith.data import shards
from draftsmith.errors import DraftsmithError
from draftsmith.eval.compare import report
from draftsmith.eval.score import ScoreConfig, score_specs
from draftsmith.families.specs import Adaptive, DraftModel, Named, NGram, Trained
from draftsmith.targets import default as default_target
from draftsmith.train.suite import FAST, PLANS, make_data, train_all


def export_best(out: Path, trained: dict[str, Path], k: int) -> dict:
    """Export the trained drafter with the highest measured speedup at ``k`` to ``out/export/<name>``
    and record it in ``out/export/best.json`` (returned). Exporting takes a second, so it is redone every run
    and can never be stale."""
    from draftsmith.export.registry import serving_format, write_export

    rows = json.loads((out / "score" / f"k{k}" / "report.json").read_text())["drafters"]
    best = max((r for r in rows if r["name"] in trained), key=lambda r: (r["speedup"], r["tau"]))
    name = best["name"]
    fmt = serving_format(json.loads((trained[name] / "config.json").read_text())["method"])
    dest = out / "export" / name
    shutil.rmtree(out / "export", ignore_errors=True)
    record = {"name": name}
    try:
        command = write_export(trained[name], fmt, dest, overwrite=True)
    except DraftsmithError as e:  # e.g. an EAGLE-3 on a target too shallow for engines to feed it
        record["refused"] = f"--to {fmt}: {e}"
        fmt, command = "native", write_export(trained[name], "native", dest, overwrite=True)
    record |= {
        "format": fmt,
        "dir": str(dest.absolute()),
        "k": k,
        "speedup": best["speedup"],
        "tau": best["tau"],
        "command": command,
    }
    (out / "export" / "best.json").write_text(json.dumps(record, indent=2))
    if "refused" in record:
        print(f"  {record['refused']}")
    return record


class Stages:
    """Prints each stage's header and records its wall time (this invocation's, reuse included)."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.seconds, self.started = names, {}, time.perf_counter()
        self.current: str | None = None

    def start(self, name: str) -> None:
        self.stop()
        self.current, self.at = name, time.perf_counter()
        print(f"[{self.names.index(name) + 1}/{len(self.names)}] {name}")

    def stop(self) -> None:
        if self.current:
            self.seconds[self.current] = round(time.perf_counter() - self.at, 1)
            self.current = None

    def summary(self) -> dict:
        self.stop()
        return {"stages_seconds": self.seconds, "total_seconds": round(time.perf_counter() - self.started, 1)}


STAGES = [
    "target",
    "on-policy data from the target",
    "train drafters",
    "score drafters with the verifier",
    "export the fastest drafter for serving",
    "report",
]


def _target_dir(target: str, fast: bool) -> Path:
    """The built-in ``target``'s directory, built or converted on first use; prints what it is."""
    if target == "default":
        path = default_target.build(default_target.FAST if fast else default_target.TargetBuildConfig())
        build = json.loads((path / "build.json").read_text())
        print(
            f"  {path}: held-out perplexity {build['target']['heldout_ppl']} "
            f"(unigram {build['unigram_heldout_ppl']}), {build['target']['params'] / 1e6:.1f}M parameters"
        )
        return path
    path = targets.resolve(target)
    fp = json.loads((path / "convert.json").read_text())["fingerprint"]
    print(
        f"  {path}: {fp['model_type']}, {fp['num_layers']} layers, hidden {fp['hidden_size']}, vocab {fp['vocab_size']}"
    )
    return path


def quickstart(
    out: Path | None = None, fast: bool = False, k: int = 4, target: str = "default", dtype: str = "auto"
) -> Path:
    """Build (or reuse) a built-in target, generate on-policy data, train every drafter family, score them all
    at several draft lengths, and write the comparison report with plots to ``out/report``.

    Args:
        out: run directory (default ``runs/quickstart``, ``runs/quickstart-<target>`` for other targets); every
            stage's artifact is reused when present.
        fast: tiny budgets everywhere (for tests and smoke runs).
        k: tokens drafted per round in the main table (also scored: the plan's other K).
        target: ``default`` (the embedded toy target, minutes) or ``smollm2`` (SmolLM2-135M-Instruct, about an hour
            on 2 CPU cores).
        dtype: the dtype the target computes in everywhere (``auto``: its released one, bf16 for ``smollm2``, in
            bf16 only where this machine multiplies it natively).
    """
    if target not in PLANS:
        raise DraftsmithError(f"quickstart: --target must be one of {', '.join(PLANS)}, got {target!r}")
    plan = PLANS[target]
    out = Path(out or ("runs/quickstart" if target == "default" else f"runs/quickstart-{target}"))
    budget = FAST if fast else plan.budget
    # the stage lines say what runs; Lightning's per-fit banners (accelerators, tips, the srun hint where
    # SLURM is installed) would bury them
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="The `srun` command is available")
    transformers.utils.logging.disable_progress_bar()
    stages = Stages(STAGES)
    stages.start("target")
    target_dir = _target_dir(target, fast)
    resolved = targets.target_dtype(targets.parse_target(target, dtype), target_dir)
    if resolved != targets.checkpoint_dtype(targets.TargetSpec(str(target_dir)), target_dir):
        plan = replace(plan, dtype=resolved)
    print(f"  computing in {resolved}")
    stages.start("on-policy data from the target")
    data = make_data(target_dir, out, budget, plan)
    write_manifest(out, target=shards.read_metadata(data[0])["target"], plan=target, fast=fast, k=k)
    stages.start("train drafters")
    trained = train_all(target_dir, data, out, budget, plan, fast)
    stages.start("score drafters with the verifier")
    specs = [Named("ngram", NGram())]
    specs += [Named(name, Trained(str(path))) for name, path in trained.items() if not name.endswith("-head")]
    if "eagle1-head" in trained:
        specs.append(Named("eagle1-adaptive", Adaptive(str(trained["eagle1-head"]), 0.5)))
    if (target_dir / "sibling").is_dir():
        specs.insert(1, Named("sibling", DraftModel(str(target_dir / "sibling"))))
    if (out / "drafters" / "draft_lm_init").is_dir():
        specs.append(Named("draft_lm_undistilled", DraftModel(str(out / "drafters" / "draft_lm_init"))))
    for kk in sorted({*plan.ks, k}):
        path = out / "score" / f"k{kk}"
        config = ScoreConfig(plan.prompts[1], num_prompts=budget.score_prompts, k=kk, max_new_tokens=budget.new_tokens)
        stage = {"score": [asdict(s) | {"kind": type(s.spec).__name__} for s in specs], "config": asdict(config)}
        if not is_current(path, stage):
            score_specs(plan.target(target_dir), specs, config, path, stage)
    stages.start("export the fastest drafter for serving")
    best = export_best(out, {n: p for n, p in trained.items() if not n.endswith("-head")}, k)
    print(
        f"  {best['name']} ({best['speedup']:.2f}x at K={k}) -> {best['dir']} ({best['format']})\n  {best['command']}"
    )
    stages.start("report")
    path = report([out], k=k)
    timings = stages.summary()
    (out / "timings.json").write_text(json.dumps(timings, indent=2))
    minutes, seconds = divmod(round(timings["total_seconds"]), 60)
    per_stage = ", ".join(f"{name} {secs:.0f} s" for name, secs in timings["stages_seconds"].items())
    print(f"quickstart done in {minutes} min {seconds} s ({per_stage}); wrote {out / 'timings.json'}")
    return path
