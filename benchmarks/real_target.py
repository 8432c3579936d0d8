"""Every drafter family on a real pretrained LLM: SmolLM2-135M-Instruct (``--target smollm2``).

    python benchmarks/real_target.py [--out runs/real_target] [--num-prompts 8] [--max-new-tokens 64]
    python benchmarks/real_target.py --dtype bfloat16 --out runs/real_target_bf16 --name real_target_bf16 \
        --ks 2 4 auto --num-prompts 32 --max-new-tokens 128 --sets chat-heldout mt-bench --blocks greedy --skip-head \
        [--auto-only mt-bench]

Stages (each reused from ``--out`` when finished, so an interrupted run resumes):
1. the quickstart's SmolLM2 plan: on-policy data on the built-in chat prompts, the feature cache, EAGLE-3,
   EAGLE-1, Medusa-1, Hydra++, a distilled draft LM (from the target's first 2 layers) and a SpecDec++ head;
2. the verifier on held-out chat prompts, each block one interleaved run with plain decoding: greedy chains at
   each ``--ks`` (every family at K = 4, the short list at the others), the ``--trees`` at K = 4 (EAGLE-2 dynamic
   trees for EAGLE-3 and Hydra++, Medusa's static tree), and ``--sampled`` drafters at T = 0.7, top-p 0.9, K = 4;
3. the verification cost ratio r(K) = t(target forward of K+1 tokens) / t(one decode step) on a cached context
   (every score row also carries its own r, measured in its run, and the ideal speedup τ / (r + K̄·c)).
HF transformers' own decoding on the same target and draft LM: ``benchmarks/baselines.py --target smollm2``.
The defaults fit about an hour of scoring on 2 CPU cores; ``--ks 2 4 6 --trees eagle3-tree medusa1-tree
hydrapp-tree`` is the full plan.
``--dtype`` trains and scores against the target in that dtype (bf16: batch-invariant, ``core.numerics``); ``--sets``
adds MT-bench (``--num-prompts`` / 8 questions per category, τ and speedup per category); ``--ks auto`` adds a block
where each drafter runs at the K ``score --k auto`` chooses.
Writes ``benchmarks/results/<--name>.{json,md}`` and PNG plots beside them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from common import RESULTS, Load, machine, mtbench_subset, saved, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval import plots
from draftsmith.eval.calibration import verify_ratios
from draftsmith.eval.report import auto_k_table, markdown_table
from draftsmith.eval.rows import block_dicts, read_block, read_rows
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import load_drafter
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import load_target, resolve, resolve_target
from draftsmith.train.suite import PLANS, make_data, train_all

CHAINS = ["ngram", "eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm", "draft_lm_undistilled", "eagle1-adaptive"]
SHORT_LIST = ["ngram", "eagle3", "eagle1", "draft_lm"]
"""Chains also scored at K = 2 and 6."""
TREES = {
    "eagle3-tree": ("eagle3", TreeKind.DYNAMIC),
    "medusa1-tree": ("medusa1", TreeKind.STATIC),
    "hydrapp-tree": ("hydrapp", TreeKind.DYNAMIC),
}
SAMPLED = ["ngram", "eagle3", "eagle1", "draft_lm", "eagle3-tree"]


def spec(name: str, drafters: Path) -> str:
    if name == "ngram":
        return "ngram"
    if name == "draft_lm_undistilled":
        return str(drafters / "draft_lm_init")
    if name == "eagle1-adaptive":
        return f"adaptive:0.5:{drafters / 'eagle1-head'}"
    return str(drafters / name)


def load(names: list[str], target: Target, drafters: Path, k: int) -> dict:
    out = {}
    for name in names:
        base, tree = TREES.get(name, (name, TreeKind.CHAIN))
        d = load_drafter(spec(base, drafters), target)
        if isinstance(d, TreeDrafter):
            d.set_tree(TreePolicy(tree, 16, 4), k)
        out[name] = d
    return out


def block(target, names, drafters, prompts, k, sampling, max_new, categories=None) -> dict:
    loaded = load(names, target, drafters, 4 if k == "auto" else k)
    plain, rows = score_drafters(target, loaded, prompts, k, sampling, max_new, categories=categories)
    return {"k": k, "temperature": sampling.temperature, "top_p": sampling.top_p, **block_dicts(plain, rows)}


def cost_ratios(target: Target, prompt: list[int], ks: list[int], repeats: int = 15) -> dict:
    """r(K): median time of a target forward of K+1 new tokens over one of 1 token, on the same cached context."""
    ratios, step = verify_ratios(target, prompt, [k + 1 for k in ks], repeats)
    return {k: round(ratios[k + 1], 3) for k in ks} | {"step_ms": round(1e3 * step, 1)}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Every family on SmolLM2-135M-Instruct ({result.get('dtype', 'float32')})",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m.get('cpu', m['platform'])}"
        f"{', ' + ', '.join(m['cpu_flags']) if m.get('cpu_flags') else ''}; {m['threads']} threads; load average "
        f"before / after {result['load'][0]} / {result['load'][1]}). Target in {result.get('dtype', 'float32')}"
        f"{' (batch-invariant)' if result.get('batch_invariant') else ''}. {result['num_prompts']} prompts per set × "
        f"{result['max_new_tokens']} new tokens. Each table is one run, every row interleaved per prompt with "
        "plain decoding of the same target.",
        "",
        f"Verification cost ratio r(K) = t(forward of K+1 tokens) / t(decode step) on a cached context "
        f"(decode step {result['r']['step_ms']} ms): "
        + ", ".join(f"r({k}) = {v}" for k, v in result["r"].items() if k != "step_ms")
        + ". In the tables, `ideal` = τ / (r + K̄·c) with each row's r measured in its own run: the speedup a "
        "drafter of this τ and cost allows on this machine.",
    ]
    for title, b in result["blocks"].items():
        plain, rows = read_block(b)
        lines += ["", f"## {title}", "", markdown_table(rows, plain), ""]
        auto = auto_k_table(rows)
        if auto:
            lines += [auto, ""]
        with_categories = [d for d in rows if d.categories]
        if with_categories:
            lines += ["Per MT-bench category (τ / speedup):", ""]
            lines += ["| drafter | " + " | ".join(with_categories[0].categories) + " |"]
            lines += ["|---|" + "---|" * len(with_categories[0].categories)]
            for d in with_categories:
                cells = [f"{c['tau']:.2f} / {c['speedup']:.2f}×" for c in d.categories.values()]
                lines.append(f"| {d.name} | " + " | ".join(cells) + " |")
            lines.append("")
    if result.get("dtype", "float32") == "float32":
        lines += ["", "HF transformers' decoding on this target: `benchmarks/results/baselines_smollm2.md`."]
    name = result.get("name", "real_target")
    lines += ["", f"![speedup]({name}_speedup.png) ![tau]({name}_tau_vs_k.png)", ""]
    return "\n".join(lines)


def prompt_sets(names: list[str], plan, tokenizer, n: int) -> dict[str, tuple[list[list[int]], list | None]]:
    """Each set's encoded prompts and categories (MT-bench: n / 8 per category; chat-heldout: the first n)."""
    out = {}
    for name in names:
        loaded = mtbench_subset(n) if name == "mt-bench" else load_prompts(plan.prompts[1], limit=n)
        categories = [p.category for p in loaded] if name == "mt-bench" else None
        out[name] = ([encode(p, tokenizer) for p in loaded], categories)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/real_target"))
    parser.add_argument("--name", default="real_target", help="results file name under benchmarks/results")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", nargs="+", default=["4"], help="chain draft lengths (4 is always scored) or auto")
    parser.add_argument("--sets", nargs="+", default=["chat-heldout"], choices=["chat-heldout", "mt-bench"])
    parser.add_argument("--chains", nargs="+", default=CHAINS, choices=CHAINS, help="drafters scored as chains at K=4")
    parser.add_argument("--trees", nargs="*", default=["eagle3-tree"], choices=list(TREES))
    parser.add_argument("--sampled", nargs="*", default=SAMPLED, help="drafters scored with T = 0.7, top-p 0.9")
    parser.add_argument("--blocks", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    parser.add_argument("--skip-head", action="store_true", help="no SpecDec++ head (no eagle1-adaptive row)")
    parser.add_argument("--auto-only", nargs="*", default=[], help="sets scored only at --k auto (a shorter run)")
    args = parser.parse_args()
    machine_load = Load()
    plan = replace(PLANS["smollm2"], acceptance_head=not args.skip_head, dtype=args.dtype)
    chains = [c for c in args.chains if not (args.skip_head and c == "eagle1-adaptive")]
    target_dir = resolve("smollm2")
    resolved = resolve_target(plan.target(target_dir), quiet=True)
    data = make_data(resolved, args.out, plan.budget, plan)
    train_all(resolved, data, args.out, plan.budget, plan)
    drafters = args.out / "drafters"
    target = load_target(resolved)
    sets = prompt_sets(args.sets, plan, target.tokenizer, args.num_prompts)
    greedy, sampled = Sampling(0.0), Sampling(0.7, 0.9)
    blocks, n = {}, args.max_new_tokens
    scores = args.out / "bench"
    ks = sorted({4, *(int(k) for k in args.ks if k != "auto")}) + (["auto"] if "auto" in args.ks else [])
    for set_name, (prompts, categories) in sets.items():
        tag = "" if set_name == "chat-heldout" else f"-{set_name}"
        for k in ["auto"] if set_name in args.auto_only else ks:
            names = chains + args.trees if k == 4 else SHORT_LIST
            title = f"{set_name}, greedy, K = {k}" + (", chains and trees" if k == 4 else "")
            blocks[title] = saved(
                scores / f"greedy-k{k}{tag}.json",
                lambda k=k, names=names, prompts=prompts, categories=categories: block(
                    target, names, drafters, prompts, k, greedy, n, categories
                ),
            )
        if "sampled" in args.blocks:
            blocks[f"{set_name}, sampled T = 0.7, top-p 0.9, K = 4"] = saved(
                scores / f"sampled-k4{tag}.json",
                lambda prompts=prompts: block(target, args.sampled, drafters, prompts, 4, sampled, n),
            )
    first = next(iter(sets.values()))[0][0]
    r = saved(scores / "r.json", lambda: cost_ratios(target, first, [2, 4, 6]))
    result = {
        "machine": machine(),
        "name": args.name,
        "dtype": target.dtype,
        "batch_invariant": target.batch_invariant,
        "load": machine_load.span(),
        "num_prompts": args.num_prompts,
        "max_new_tokens": n,
        "r": r,
        "blocks": blocks,
        "training": {
            name: json.loads((drafters / name / "config.json").read_text()).get("val_tau_est")
            for name in ["eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm"]
        },
    }
    k4 = blocks[f"{args.sets[0]}, greedy, K = 4, chains and trees"]
    k4_plain, k4_rows = read_block(k4)
    plots.speedup_bars(k4_rows, k4_plain, RESULTS / f"{args.name}_speedup.png")
    by_k = {
        b["k"]: [d for d in read_rows(b["drafters"]) if d.name in SHORT_LIST]
        for t, b in blocks.items()
        if "greedy" in t and t.startswith(args.sets[0]) and b["k"] != "auto"
    }
    plots.tau_vs_k(by_k, RESULTS / f"{args.name}_tau_vs_k.png")
    write(args.name, result, markdown(result))


if __name__ == "__main__":
    main()
