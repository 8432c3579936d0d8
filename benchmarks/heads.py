"""Heads and self-drafters on one target, in one run: Medusa-1, Hydra, Hydra++, Clover and Falcon (chains, static and
dynamic trees), and Kangaroo beside its untrained adapter (plain early exit) and the untrained layer skipper.

    python benchmarks/heads.py [--target default|smollm2] [--out DIR] [--ks 4] [--num-prompts 6] [--families ...]

Stages (each reused from ``--out`` when finished, so an interrupted run resumes):
1. the target's data (``train.suite``'s plan: the quickstart's on the default target; for SmolLM2 the real-target
   benchmark's ``runs/real_target`` data and feature cache are reused when current);
2. each family from its recipe (``configs/[smollm2/]NAME.yaml``) on the same data: ``--steps`` each on the default
   target, the recipes' budgets on SmolLM2; exports of the same resolved config are reused;
3. the verifier on held-out prompts, greedy, one block per K: every head family as a chain, a static tree (from its
   held-out top-k accuracies) and a dynamic tree (EAGLE-2), Kangaroo as a chain with its early exit, ``kangaroo_exit``
   (the same target layers with the untrained adapter: what training buys), ``kangaroo_noexit`` (the trained one
   without its early exit) and ``skip`` (SWIFT-style: the target
   skipping half its layers, no training). One interleaved run with plain decoding of the same target per block.

Writes ``benchmarks/results/heads_<target>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from common import HELDOUT, Load, machine, prompt_ids, saved_block, write

from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.feature_cache import eagle3_features
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import ScoreRow, block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.kangaroo.module import KangarooModule
from draftsmith.families.specs import load_drafter
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import resolve, resolve_target
from draftsmith.train.fit import FitRun, load_recipe
from draftsmith.train.suite import PLANS, make_data, train_drafter

TREE_FAMILIES = ["medusa1", "hydra", "hydrapp", "clover", "falcon", "falcon_k1"]
VARIANTS = {"falcon_k1": ("falcon", {"block": 1})}
"""Rows trained from another family's recipe with other settings: Falcon drafting one token per forward (EAGLE-1
with a two-pass training-time test), what the semi-autoregressive block costs at these budgets."""
CHAIN_FAMILIES = ["kangaroo"]
UNTRAINED = {"kangaroo_exit": None, "skip": "skip:0.5"}
"""Rows without training: Kangaroo's adapter as it starts (early exit at its layer), and the layer skipper."""
NO_EXIT = "kangaroo_noexit"
"""The trained Kangaroo without its second early exit (threshold 0: it always drafts K)."""


def drafters_for(target: Target, exports: dict[str, Path], k: int, tree_size: int, top_k: int) -> dict:
    out = {}
    for name, path in exports.items():
        spec = UNTRAINED.get(name) or str(path)
        kinds = (TreeKind.CHAIN, TreeKind.STATIC, TreeKind.DYNAMIC) if name in TREE_FAMILIES else (TreeKind.CHAIN,)
        for kind in kinds:
            drafter = load_drafter(spec, target)
            if isinstance(drafter, TreeDrafter):
                drafter.set_tree(TreePolicy(kind, tree_size, top_k), k)
            out[f"{name}/{kind}" if name in TREE_FAMILIES else name] = drafter
        if name == "kangaroo":
            out[NO_EXIT] = load_drafter(spec, target)
            out[NO_EXIT].threshold = 0.0
    return out


def block(target: Target, drafters: dict, prompts, k: int, max_new: int) -> dict:
    plain, rows = score_drafters(target, drafters, prompts, k, Sampling(0.0), max_new)
    return {"k": k, **block_dicts(plain, rows)}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Heads and self-drafters on the {result['target']} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; load average "
        f"before / after {result['load'][0]} / {result['load'][1]}). Greedy; held-out prompts: {result['num_prompts']}"
        f" × {result['max_new_tokens']} new tokens; trees of {result['tree_size']} nodes (dynamic: top-"
        f"{result['top_k']} per depth). Each table is one run, every row interleaved per prompt with plain decoding of "
        "the same target; `c` is the drafter's time per drafted token over a decode step.",
        "",
        "Training: " + ", ".join(f"{n} {s} steps" for n, s in result["steps"].items()) + ". `val/tau_est` (K = 4) "
        "of the exports: " + ", ".join(f"{n} {v:.2f}" for n, v in result["training"].items() if v is not None) + ".",
    ]
    for title, b in result["blocks"].items():
        plain, rows = read_block(b)
        lines += ["", f"## {title}", "", *summary(rows), "", "### All rows", "", markdown_table(rows, plain)]
    return "\n".join(lines) + "\n"


def summary(scored: list[ScoreRow]) -> list[str]:
    """τ and speedup of each family as a chain and in both trees (a row per family), then the chain-only rows."""
    rows = {r.name: r for r in scored}
    out = [
        "| drafter | chain τ | static τ | dynamic τ | chain × | static × | dynamic × |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in [n for n in TREE_FAMILIES if f"{n}/chain" in rows]:
        c, s, d = (rows[f"{name}/{kind}"] for kind in ("chain", "static", "dynamic"))
        out.append(
            f"| {name} | {c.tau:.2f} | {s.tau:.2f} | {d.tau:.2f} | {c.speedup:.2f}× "
            f"| {s.speedup:.2f}× | {d.speedup:.2f}× |"
        )
    for name in [n for n in (*CHAIN_FAMILIES, NO_EXIT, *UNTRAINED) if n in rows]:
        out.append(f"| {name} | {rows[name].tau:.2f} | – | – | {rows[name].speedup:.2f}× | – | – |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default", choices=["default", "smollm2"])
    parser.add_argument("--out", type=Path, default=None, help="default: runs/real_target for SmolLM2, else runs/heads")
    parser.add_argument("--steps", type=int, default=None, help="default target: 120 per family; SmolLM2: the recipes'")
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[4])
    parser.add_argument("--tree-size", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--families", nargs="+", default=TREE_FAMILIES + CHAIN_FAMILIES + list(UNTRAINED))
    parser.add_argument("--train-only", action="store_true", help="stop after training (score in a later run)")
    args = parser.parse_args()
    out = args.out or Path("runs/real_target" if args.target == "smollm2" else "runs/heads")
    steps = args.steps or (None if args.target == "smollm2" else 120)
    load = Load()
    plan = replace(PLANS[args.target], acceptance_head=False)
    target_dir = resolve(args.target)
    resolved = resolve_target(plan.target(target_dir), quiet=True)
    data = make_data(resolved, out, plan.budget, plan)
    features = None
    if plan.features:  # the cache of EAGLE-3's layers and the final state: Kangaroo's exit layer is among them
        features = eagle3_features(resolved, data[0])
    exports, budget = {}, {}
    for name in [n for n in args.families if n in TREE_FAMILIES + CHAIN_FAMILIES]:
        family, settings = VARIANTS.get(name, (name, {}))
        recipe = plan.recipe(family)
        budget[name] = steps or load_recipe(recipe)["trainer"]["max_steps"]
        print(f"  {name} (recipe {recipe} {settings or ''}, {budget[name]} steps)")
        run = FitRun(steps=budget[name], model=settings)
        exports[name] = train_drafter(recipe, resolved, data, out, plan.budget, name=name, features=features, run=run)
    if "kangaroo_exit" in args.families:
        exit_layer = load_recipe(plan.recipe("kangaroo"))["model"]["init_args"]["exit_layer"]
        module = KangarooModule(str(target_dir), exit_layer=exit_layer)
        exports["kangaroo_exit"] = save_native(module.drafter, module.target, out / "drafters" / "kangaroo_exit")
    exports.update({name: None for name in UNTRAINED if name in args.families and name not in exports})
    if args.train_only:
        return

    target = Target.from_pretrained(target_dir)
    prompts = prompt_ids(HELDOUT[args.target], target.tokenizer, args.num_prompts)
    blocks = {}
    for k in args.ks:
        drafters = drafters_for(target, exports, k, args.tree_size, args.top_k)
        blocks[f"greedy, K = {k}"] = saved_block(
            out / "bench" / "heads" / f"greedy-k{k}.json",
            list(drafters),
            lambda d=drafters, k=k: block(target, d, prompts, k, args.max_new_tokens),
        )
    records = {n: json.loads((p / "config.json").read_text()) for n, p in exports.items() if p is not None}
    result = {
        "machine": machine(),
        "target": args.target,
        "load": load.span(),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "tree_size": args.tree_size,
        "top_k": args.top_k,
        "steps": budget,
        "training": {n: r.get("val_tau_est") for n, r in records.items()},
        "blocks": blocks,
    }
    write(f"heads_{args.target}", result, markdown(result))


if __name__ == "__main__":
    main()
