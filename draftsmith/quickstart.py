"""``draftsmith quickstart``: the whole pipeline on a built-in target (``default``: the embedded toy; ``smollm2``:
SmolLM2-135M-Instruct, a real pretrained LLM; see ``PLANS``).

Stages (each one's artifact under ``out`` is reused when present, so a re-run is fast):
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
from dataclasses import dataclass, field
from pathlib import Path

import transformers

from draftsmith import default_target
from draftsmith.data import shards
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.eval.compare import report
from draftsmith.eval.score import named, score


@dataclass(frozen=True)
class Budget:
    """How much work each stage does."""

    train_prompts: int = 600
    """Built-in training prompts the target continues (sampled, T=1)."""
    new_tokens: int = 48
    """Tokens the target generates per prompt, for data and for scoring."""
    score_prompts: int = 10
    """Held-out prompts: greedy validation data and the verifier's scoring set (the same prompts)."""
    fit_steps: int = 100
    """Optimizer steps per drafter."""
    batch_size: int = 8
    """Training sequences per step."""
    head_prompts: int = 200
    """Built-in training prompts the target continues greedily for the acceptance head."""


FULL = Budget()
FAST = Budget(train_prompts=48, new_tokens=24, score_prompts=4, fit_steps=12, batch_size=4, head_prompts=16)


DRAFTERS = {
    "eagle3": [
        "--model=draftsmith.train.eagle.EagleModule",
        "--model.init_args.version=3",
        "--model.init_args.draft_vocab_size=1024",
    ],
    "eagle1": ["--model=draftsmith.train.eagle.EagleModule", "--model.init_args.version=1"],
    "medusa1": ["--model=draftsmith.train.medusa.MedusaModule", "--model.init_args.distill=true"],
    "medusa2": [
        "--model=draftsmith.train.medusa.MedusaModule",
        "--model.init_args.distill=true",
        "--model.init_args.lora=draftsmith.train.medusa.LoraSpec",
        "--model.init_args.head_warmup_steps=60",
    ],
    "hydra": ["--model=draftsmith.train.hydra.HydraModule"],
    "hydrapp": [
        "--model=draftsmith.train.hydra.HydraModule",
        "--model.init_args.prefix_attention=true",
        "--model.init_args.num_layers=4",
        "--model.init_args.distill=true",
    ],
}
"""Drafter recipes (``draftsmith fit`` arguments beyond target, data and budget) for the quickstart and benchmarks."""

QUICKSTART_DRAFTERS = {"eagle3": 0.8, "eagle1": 1.8, "medusa1": 0.6, "hydrapp": 0.6}
"""The families the quickstart trains (Hydra and Medusa-2 are in ``benchmarks/heads.py``), each with its share of
``Budget.fit_steps``: EAGLE-1 is the cheapest per step and the family that pays off on the default target, so it
gets the most; Medusa and Hydra++ train a full-vocabulary LM head per head and cost 2-3x as much per step."""


@dataclass(frozen=True)
class Plan:
    """What the quickstart does on one built-in target."""

    budget: Budget
    """Work per stage."""
    prompts: tuple[str, str] = ("builtin:train", "builtin:heldout")
    """Training and held-out (scoring) prompt sets."""
    temperature: float = 1.0
    """Sampling temperature of the training data (validation data is greedy)."""
    top_p: float = 1.0
    """Nucleus mass of the training data."""
    ks: tuple[int, ...] = (2, 4, 6)
    """Draft lengths scored (the main table's K is always among them)."""
    shares: dict[str, float] = field(default_factory=lambda: dict(QUICKSTART_DRAFTERS))
    """The families trained, each with its share of ``Budget.fit_steps``."""
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """Per drafter, ``fit`` arguments beyond ``DRAFTERS`` for this target (sizes that depend on it)."""
    features: bool = False
    """Cache the target's hidden states over the training data once (``data/train-features``) and train the
    feature drafters from it instead of running the target in every step."""
    acceptance_head: bool = True
    """Train a SpecDec++ acceptance head on EAGLE-1 (scored as ``eagle1-adaptive``)."""
    draft_lm_layers: int = 0
    """> 0: the draft LM starts as the target's first N layers with its own embeddings, norm and head
    (``truncated_target``); 0: the target's sibling when it has one, else a fresh student pre-trained on the corpus."""


SMOLLM2 = Plan(
    # 30-layer target at ~12 tokens/s greedy on 2 CPU cores: data ~5 min, training ~35 min, scoring ~7 min
    budget=Budget(train_prompts=400, new_tokens=64, score_prompts=8, fit_steps=100, batch_size=8, head_prompts=96),
    prompts=("builtin:chat-train", "builtin:chat-heldout"),
    temperature=0.7,
    top_p=0.9,
    ks=(4,),
    features=True,
    # configs/smollm2/*.yaml hold the same settings; EAGLE-3 pays off in the papers, Medusa/Hydra heads each carry
    # a 49k-row LM head, so they get fewer steps
    shares={"eagle3": 1.0, "eagle1": 0.8, "medusa1": 0.4, "hydrapp": 0.4},
    # a 49k vocabulary: the reduced draft vocabulary is what makes EAGLE-3's head cheap
    extra_args={"eagle3": ["--model.init_args.draft_vocab_size=4096"]},
    draft_lm_layers=2,
)
PLANS = {"default": Plan(FULL), "smollm2": SMOLLM2}
"""The built-in targets the quickstart runs on."""


def _generated(target_dir: Path, path: Path, settings: dict) -> Path:
    """Generate ``path`` with ``settings`` unless a complete run of the same settings and target is there."""
    meta = shards.read_metadata(path) or {}
    made = meta.get("settings", {})
    reusable = meta.get("status") == "complete" and all(made.get(k) == v for k, v in settings.items())
    if not (reusable and meta.get("target", {}).get("name") == str(target_dir)):
        generate(str(target_dir), out=path, overwrite=True, **settings)
    return path


def make_data(target_dir: Path, out: Path, budget: Budget, plan: Plan = PLANS["default"]) -> tuple[Path, Path]:
    """Sampled training data on built-in prompts, greedy validation data on the held-out scoring prompts."""
    sampled = {"temperature": plan.temperature} | ({"top_p": plan.top_p} if plan.top_p < 1 else {})
    runs = {
        "train": {"prompts": plan.prompts[0], **sampled, "num_prompts": budget.train_prompts},
        "val": {"prompts": plan.prompts[1], "temperature": 0.0, "num_prompts": budget.score_prompts},
    }
    return tuple(
        _generated(target_dir, out / "data" / name, {**settings, "max_new_tokens": budget.new_tokens})
        for name, settings in runs.items()
    )


def make_head_data(target_dir: Path, out: Path, budget: Budget, plan: Plan = PLANS["default"]) -> Path:
    """Greedy continuations of built-in training prompts (``data/head``) for the acceptance head: greedy
    verification runs along the target's greedy text, so that is the text whose acceptances it must predict."""
    settings = {"prompts": plan.prompts[0], "temperature": 0.0, "num_prompts": budget.head_prompts}
    return _generated(target_dir, out / "data" / "head", {**settings, "max_new_tokens": budget.new_tokens})


def train_drafter(
    name: str,
    target_dir: Path,
    data: tuple[Path, Path],
    out: Path,
    budget: Budget,
    force: bool = False,
    steps: int | None = None,
    extra_args: list[str] = (),
    features: Path | None = None,
) -> Path:
    """Train one drafter with ``draftsmith fit`` for ``steps`` (default ``budget.fit_steps``) and export its best
    checkpoint (by ``val/tau_est``) to ``out/drafters/<name>``; an earlier export is reused unless ``force``.
    ``extra_args`` follow the recipe's (later arguments win); ``features``: a feature cache of the training data
    to train from."""
    from draftsmith.models.native import load_network, save_native
    from draftsmith.target import Target
    from draftsmith.train.cli import fit_main

    export, root = out / "drafters" / name, out / "fit" / name
    if (export / "model.safetensors").exists() and not force:
        return export
    shutil.rmtree(root, ignore_errors=True)
    steps = steps or budget.fit_steps
    cli = fit_main(
        [
            *DRAFTERS[name],
            *extra_args,
            *([f"--data.features={features}"] if features else []),
            f"--model.init_args.target={target_dir}",
            f"--data.train={data[0]}",
            f"--data.val={data[1]}",
            f"--data.batch_size={budget.batch_size}",
            "--model.init_args.optim.lr=0.002",
            f"--model.init_args.optim.warmup_steps={max(1, steps // 10)}",
            f"--trainer.max_steps={steps}",
            "--trainer.max_epochs=-1",
            "--trainer.check_val_every_n_epoch=null",
            f"--trainer.val_check_interval={max(1, steps // 4)}",
            f"--trainer.default_root_dir={root}",
            "--trainer.enable_model_summary=false",
        ]
    )
    best = cli.trainer.checkpoint_callback
    target = Target.from_pretrained(target_dir)
    network, info = load_network(best.best_model_path, target)
    extra = {"checkpoint": str(best.best_model_path), "val_tau_est": float(best.best_model_score)}
    if info.get("topk_accuracy"):
        extra["topk_accuracy"] = info["topk_accuracy"]
    save_native(network, target, export, extra)
    return export


def train_acceptance_head(target_dir: Path, drafter: Path, data: tuple[Path, Path], out: Path, budget: Budget) -> Path:
    """A SpecDec++ acceptance head on ``drafter`` (``drafters/<drafter>-head``), trained on ``data`` (train,
    val); reused when present.

    Scored as ``adaptive:0.5:HEAD``: K is the most it drafts; it stops once a rejection among the tokens
    drafted so far is predicted more likely than not (``benchmarks/adaptive.py``: 0.3 and 0.5 within 1%).
    """
    from draftsmith.train.acceptance_head import train_head

    export = out / "drafters" / f"{drafter.name}-head"
    if (export / "model.safetensors").exists():
        return export
    steps = max(10, budget.fit_steps // 2)
    path, _ = train_head(str(target_dir), str(drafter), str(data[0]), str(data[1]), export, max_steps=steps)
    return path


def serving_format(method: str) -> str:
    """The format the quickstart exports a drafter of ``method`` to: vLLM where vLLM serves the family, plain HF
    for draft LMs (a ``transformers`` assistant model or vLLM ``draft_model``), else draftsmith's own."""
    from draftsmith.export import vllm

    return "vllm" if method in vllm.METHODS else "hf" if method == "draft_lm" else "native"


def export_best(out: Path, trained: dict[str, Path], k: int) -> dict:
    """Export the trained drafter with the highest measured speedup at ``k`` to ``out/export/<name>``
    and record it in ``out/export/best.json`` (returned). Exporting takes a second, so it is redone every run
    and can never be stale."""
    from draftsmith.export.registry import write_export

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
    path = default_target.resolve(target)
    fp = json.loads((path / "convert.json").read_text())["fingerprint"]
    print(
        f"  {path}: {fp['model_type']}, {fp['num_layers']} layers, hidden {fp['hidden_size']}, vocab {fp['vocab_size']}"
    )
    return path


def quickstart(out: Path | None = None, fast: bool = False, k: int = 4, target: str = "default") -> Path:
    """Build (or reuse) a built-in target, generate on-policy data, train every drafter family, score them all
    at several draft lengths, and write the comparison report with plots to ``out/report``.

    Args:
        out: run directory (default ``runs/quickstart``, ``runs/quickstart-<target>`` for other targets); every
            stage's artifact is reused when present.
        fast: tiny budgets everywhere (for tests and smoke runs).
        k: tokens drafted per round in the main table (also scored: the plan's other K).
        target: ``default`` (the embedded toy target, minutes) or ``smollm2`` (SmolLM2-135M-Instruct, about an hour
            on 2 CPU cores).
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
    stages.start("on-policy data from the target")
    data = make_data(target_dir, out, budget, plan)
    stages.start("train drafters")
    trained = train_all(target_dir, data, out, budget, plan, fast)
    stages.start("score drafters with the verifier")
    specs = ["ngram"] + [f"{name}={path}" for name, path in trained.items() if not name.endswith("-head")]
    if "eagle1-head" in trained:
        specs.append(f"eagle1-adaptive=adaptive:0.5:{trained['eagle1-head']}")
    if (target_dir / "sibling").is_dir():
        specs.insert(1, f"sibling={target_dir / 'sibling'}")
    if (out / "drafters" / "draft_lm_init").is_dir():
        specs.append(f"draft_lm_undistilled={out / 'drafters' / 'draft_lm_init'}")
    for kk in sorted({*plan.ks, k}):
        path = out / "score" / f"k{kk}"
        if _score_is_current(path / "report.json", specs, budget):
            continue
        score(
            target=str(target_dir),
            drafter=specs,
            prompts=plan.prompts[1],
            k=kk,
            num_prompts=budget.score_prompts,
            max_new_tokens=budget.new_tokens,
            out=path,
        )
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


def train_all(
    target_dir: Path, data: tuple[Path, Path], out: Path, budget: Budget, plan: Plan, fast: bool = False
) -> dict[str, Path]:
    """Train every family of the quickstart (each reused when exported already); returns name -> native dir,
    the acceptance head as ``eagle1-head``."""
    from draftsmith.train import draft_lm_stages

    trained, features = {}, None
    if plan.features:
        from draftsmith.data.feature_cache import cache_features
        from draftsmith.train.eagle import default_feature_layers

        layers = json.loads((target_dir / "config.json").read_text())["num_hidden_layers"]
        print("  the target's hidden states over the training data (feature cache)")
        features = cache_features(str(target_dir), data[0], list(default_feature_layers(layers, 3)), overwrite=True)
    for name, share in plan.shares.items():
        steps = max(2, round(share * budget.fit_steps))
        print(f"  {name} ({steps} steps)")
        args = plan.extra_args.get(name, [])
        trained[name] = train_drafter(
            name, target_dir, data, out, budget, steps=steps, extra_args=args, features=features
        )
    if plan.draft_lm_layers:
        init = draft_lm_stages.truncated_target(target_dir, plan.draft_lm_layers, out / "drafters" / "draft_lm_init")
        what = f"the target's first {plan.draft_lm_layers} layers with its embeddings, norm and head"
    else:
        init = target_dir / "sibling" if (target_dir / "sibling").is_dir() else None
        what = "the target's sibling, pre-trained on its corpus" if init else "a student pre-trained on the corpus"
    print(f"  draft_lm (DistillSpec on-policy distillation of {what})")
    lm_budget = draft_lm_stages.FAST if fast else draft_lm_stages.QUICK
    trained["draft_lm"] = draft_lm_stages.train_distilled_draft_lm(target_dir, data, out, lm_budget, init=init)
    if plan.acceptance_head:
        print("  eagle1 acceptance head (SpecDec++)")
        head_data = (make_head_data(target_dir, out, budget, plan), data[1])
        trained["eagle1-head"] = train_acceptance_head(target_dir, trained["eagle1"], head_data, out, budget)
    return trained


def _score_is_current(path: Path, specs: list[str], budget: Budget) -> bool:
    """Whether a saved score report covers these drafters with this budget (then it is reused)."""
    if not path.is_file():
        return False
    saved = json.loads(path.read_text())
    names = [named(s)[0] for s in specs]
    config = saved["config"]
    return (
        [r["name"] for r in saved["drafters"]] == names
        and config["num_prompts"] == budget.score_prompts
        and config["max_new_tokens"] == budget.new_tokens
    )
