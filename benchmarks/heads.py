"""Medusa-1, Medusa-2, Hydra, Hydra++ (and EAGLE-3) on the default target: chain vs static vs dynamic trees.

Run: ``.venv/bin/python benchmarks/heads.py [--steps 240] [--k 4] [--tree-size 16]``.
Every drafter trains on the same on-policy data for the same steps (the quickstart's recipe), then
the verifier scores each one three ways — chain, static tree (from its held-out top-k
accuracies) and dynamic tree (EAGLE-2) — side by side with plain decoding of the same target on
the same held-out prompts, greedy, in one run. Medusa-2 fine-tunes its target, so it is compared
with plain decoding of its own (adapted) target, in the same loop.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import machine, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval.report import markdown_table
from draftsmith.eval.score import score_drafters
from draftsmith.families.registry import load_trained
from draftsmith.layers.tree_draft import TreePolicy
from draftsmith.targets import default as default_target
from draftsmith.train.fit import FitRun
from draftsmith.train.suite import Budget, make_data, train_drafter

FAMILIES = ("medusa1", "medusa2", "hydra", "hydrapp", "eagle3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--train-prompts", type=int, default=1000)
    parser.add_argument("--score-prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tree-size", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--out", type=Path, default=Path("runs/bench-heads"))
    parser.add_argument("--retrain", action="store_true", help="train again even if an export exists")
    args = parser.parse_args()
    budget = Budget(args.train_prompts, args.new_tokens, args.score_prompts)
    run = FitRun(steps=args.steps, lr=0.002)  # every family at one learning rate, as measured before

    target_dir = default_target.build()
    data = make_data(target_dir, args.out, budget)
    target = Target.from_pretrained(target_dir)
    exports, fit_seconds = {}, {}
    for name in args.families:
        start = time.perf_counter()
        exports[name] = train_drafter(name, target_dir, data, args.out, budget, force=args.retrain, run=run)
        fit_seconds[name] = round(time.perf_counter() - start, 1)
    drafters = {}
    for name, path in exports.items():
        for kind in ("chain", "static", "dynamic"):
            drafter = load_trained(path, target)
            drafter.set_tree(TreePolicy(kind, args.tree_size, args.top_k), args.k)
            drafters[f"{name}/{kind}"] = drafter
    prompts = [encode(p, target.tokenizer) for p in load_prompts("builtin:heldout", limit=args.score_prompts)]
    plain, rows = score_drafters(target, drafters, prompts, args.k, Sampling(), args.new_tokens)

    by = {r["name"]: r for r in rows}
    lines = ["| drafter | fit | chain τ | static τ | dynamic τ | chain × | static × | dynamic × |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in exports:
        c, s, d = (by[f"{name}/{kind}"] for kind in ("chain", "static", "dynamic"))
        lines.append(
            f"| {name} | {fit_seconds[name]:.0f} s | {c['tau']:.2f} | {s['tau']:.2f} | {d['tau']:.2f} "
            f"| {c['speedup']:.2f} | {s['speedup']:.2f} | {d['speedup']:.2f} |"
        )
    out = {
        "machine": machine(),
        "target": target.fingerprint,
        "args": {k: str(v) for k, v in vars(args).items()},
        "fit_seconds": fit_seconds,
        "plain": plain,
        "drafters": rows,
    }
    m = out["machine"]
    md = (
        "## Medusa / Hydra heads on the default target: chains and trees\n\n"
        f"`{m['command']}` on {m['date']} ({m['platform']}, {m['threads']} threads). Greedy, K = {args.k} "
        f"(depth), trees of {args.tree_size} nodes (dynamic: top-{args.top_k} per depth), "
        f"{len(prompts)} held-out prompts × {args.new_tokens} tokens; speedup × is against plain decoding "
        "of the same target in the same run (Medusa-2: its adapted target).\n\n"
        + "\n".join(lines)
        + "\n\n### All rows\n\n"
        + markdown_table(rows, plain)
    )
    write("heads", out, md)


if __name__ == "__main__":
    main()
