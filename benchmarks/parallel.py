"""Parallel drafters (PARD, P-EAGLE, DFlash) beside EAGLE-3 and the draft LM, on one target, in one run.

    python benchmarks/parallel.py [--target default|smollm2] [--out DIR] [--ks 2 4 8 16] [--num-prompts 6]

Stages (each reused from ``--out`` when finished, so an interrupted run resumes):
1. the target's data and its EAGLE-3 and distilled draft LM (``train.suite``: the quickstart's plan; for
   SmolLM2 the real-target benchmark's ``runs/real_target`` is reused when it is there);
2. PARD (from the distilled draft LM), P-EAGLE (fresh, and from the EAGLE-3) and DFlash from the target's recipes (``configs/[smollm2/]``),
   trained on the same data (SmolLM2: from its feature cache, rebuilt when the data changed);
3. the verifier on held-out prompts: greedy at every ``--ks``, sampled (T = 0.7, top-p 0.9) at ``--sampled-ks``,
   each block one interleaved run with plain decoding of the same target. A parallel drafter drafts at most the
   depth it was trained for (its recipe's ``depth``).

Writes ``benchmarks/results/parallel_<target>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from common import HELDOUT, Load, machine, prompt_ids, saved_block, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.feature_cache import eagle3_features
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import load_drafter
from draftsmith.targets import resolve, resolve_target
from draftsmith.train.fit import FitRun
from draftsmith.train.suite import PLANS, make_data, train_all, train_drafter

BASELINES = ["eagle3", "draft_lm"]
PARALLEL = ["pard", "peagle", "peagle_eagle3", "dflash"]
"""Trained here; ``peagle_eagle3`` is P-EAGLE's recipe started from the EAGLE-3 row's drafter (``model.init``)."""


def block(target: Target, drafters: Path, prompts, k: int, sampling: Sampling, max_new: int) -> dict:
    loaded = {name: load_drafter(str(drafters / name), target) for name in BASELINES + PARALLEL}
    plain, rows = score_drafters(target, loaded, prompts, k, sampling, max_new)
    return {"k": k, "temperature": sampling.temperature, "top_p": sampling.top_p, **block_dicts(plain, rows)}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Parallel drafters on the {result['target']} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; load average "
        f"before / after {result['load'][0]} / {result['load'][1]}). Held-out prompts: {result['num_prompts']} × "
        f"{result['max_new_tokens']} new tokens. Each table is one run, every row interleaved per prompt with plain "
        "decoding of the same target; `c` is the drafter's time per round over a decode step, `ideal` = "
        "τ / (r + K̄·c) with the row's own r.",
        "",
        "Trained depth (tokens one forward drafts): "
        + ", ".join(f"{name} {d}" for name, d in result["depth"].items())
        + "; at a larger K they draft that many. `val/tau_est` (K = 4) of the exports: "
        + ", ".join(f"{name} {v:.2f}" for name, v in result["training"].items() if v is not None)
        + ".",
    ]
    for title, b in result["blocks"].items():
        plain, rows = read_block(b)
        lines += ["", f"## {title}", "", markdown_table(rows, plain), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default", choices=["default", "smollm2"])
    parser.add_argument(
        "--out", type=Path, default=None, help="default: runs/real_target for SmolLM2, else runs/parallel"
    )
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8, 16], help="greedy blocks")
    parser.add_argument("--sampled-ks", type=int, nargs="*", default=[4, 8], help="sampled blocks (T 0.7, top-p 0.9)")
    args = parser.parse_args()
    out = args.out or Path("runs/real_target" if args.target == "smollm2" else "runs/parallel")
    load = Load()
    plan = replace(PLANS[args.target], drafters=("eagle3",), acceptance_head=False)
    target_dir = resolve(args.target)
    resolved = resolve_target(plan.target(target_dir), quiet=True)
    data = make_data(resolved, out, plan.budget, plan)
    drafters = out / "drafters"
    if not all((drafters / name / "config.json").is_file() for name in BASELINES):
        train_all(resolved, data, out, plan.budget, plan)
    features = None
    if plan.features:  # the cache of the recipes' layers (EAGLE-3's and the final state), reused when current
        features = eagle3_features(resolved, data[0])
    starts = {"pard": "draft_lm", "peagle_eagle3": "eagle3"}
    for name in PARALLEL:
        run = FitRun(model={"init": str(drafters / starts[name])}) if name in starts else None
        recipe = plan.recipe(name.split("_")[0])
        print(f"  {name} (recipe {recipe})")
        train_drafter(recipe, resolved, data, out, plan.budget, name=name, features=features, run=run)
    target = Target.from_pretrained(target_dir)
    prompts = prompt_ids(HELDOUT[args.target], target.tokenizer, args.num_prompts)
    n, blocks = args.max_new_tokens, {}
    scores = out / "bench" / "parallel"
    for k in args.ks:
        blocks[f"greedy, K = {k}"] = saved_block(
            scores / f"greedy-k{k}.json",
            BASELINES + PARALLEL,
            lambda k=k: block(target, drafters, prompts, k, Sampling(0.0), n),
        )
    for k in args.sampled_ks:
        blocks[f"sampled T = 0.7, top-p 0.9, K = {k}"] = saved_block(
            scores / f"sampled-k{k}.json",
            BASELINES + PARALLEL,
            lambda k=k: block(target, drafters, prompts, k, Sampling(0.7, 0.9), n),
        )
    records = {name: json.loads((drafters / name / "config.json").read_text()) for name in BASELINES + PARALLEL}
    result = {
        "machine": machine(),
        "target": args.target,
        "load": load.span(),
        "num_prompts": len(prompts),
        "max_new_tokens": n,
        "depth": {name: records[name]["config"]["depth"] for name in PARALLEL},
        "training": {name: r.get("val_tau_est") for name, r in records.items()},
        "blocks": blocks,
    }
    write(f"parallel_{args.target}", result, markdown(result))


if __name__ == "__main__":
    main()
