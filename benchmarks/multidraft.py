"""Multi-draft verification at equal draft budgets: SpecInfer, SpecTr (K-SEQ), RSD-C and RSD-S, one EAGLE-3 per
target.

    python benchmarks/multidraft.py [--target default|smollm2] [--num-prompts 12] [--max-new-tokens 64]
        [--samplings 0.7:0.9 1.0:1.0] [--steps N] [--out DIR]

Stages (each reused from ``--out`` when finished, so an interrupted run resumes):
1. the target's data and an EAGLE-3 from its recipe (``train.suite``'s plan; SmolLM2 in its auto dtype, bfloat16
   where the CPU multiplies it natively, else float32, trained with the target's features computed online; the
   default target at ``--steps``);
2. per sampling setting one scored block, every row interleaved per prompt with plain decoding of the same target:
   the chain (one draft of depth 4) and, for each sampled tree shape, the three rules on the same drafter:
   ``2,1,1,1`` (at depth 1 two candidates, each continued as one chain: two drafts of length 4, 8 nodes),
   ``4,1,1,1`` (four drafts, 16 nodes) and ``2,2,1,1`` (a 14-node tree). SpecInfer and SpecTr draw siblings i.i.d.
   (a repeated candidate is verified once), RSD-C without replacement; and RSD-S, a stochastic beam search of 2 and 4
   paths (at most 8 and 16 nodes: the budgets of ``2,1,1,1`` and ``4,1,1,1``).

The papers' claims checked (as measured, in the Markdown): SpecTr, k drafts of length L accept more tokens per
round than one draft of length L; RSD, above SpecInfer's multi-candidate rule on the same tree shape; RSD-S, above
RSD-C at the same budget.
Hours: default target ~15 min (training 5, scoring 10); SmolLM2 ~45 min (data 5, training 10, scoring ~30).

Writes ``benchmarks/results/multidraft_<target>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from common import HELDOUT, Load, machine, prompt_ids, saved_block, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.trees import TreeKind, VerifyRule
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import ScoreRow, block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import load_drafter
from draftsmith.layers.tree_draft import TreePolicy
from draftsmith.targets import load_target, resolve, resolve_target
from draftsmith.train.fit import FitRun
from draftsmith.train.suite import PLANS, make_data, recipe_steps, train_drafter

K = 4
SHAPES = {"2,1,1,1": (2, 1, 1, 1), "4,1,1,1": (4, 1, 1, 1), "2,2,1,1": (2, 2, 1, 1)}
"""Sampled tree shapes (candidates per node at each depth), all of depth K."""
BEAMS = {"beam 2": (2, "2,1,1,1"), "beam 4": (4, "4,1,1,1")}
"""RSD-S rows: beam width, and the sampled shape of the same node budget (K × width)."""


def drafters_for(target, drafter: Path) -> tuple[dict, dict]:
    """The chain and each (shape, rule) row on the same trained drafter; returns (drafters, their rules)."""
    drafters, rules = {"chain": load_drafter(str(drafter), target)}, {}
    for label, branching in SHAPES.items():
        for rule in VerifyRule:
            d = load_drafter(str(drafter), target)
            d.set_tree(TreePolicy(TreeKind.SAMPLED, branching=branching, replacement=rule.replacement), K)
            drafters[f"{label}/{rule}"] = d
            rules[f"{label}/{rule}"] = rule
    for label, (width, _) in BEAMS.items():
        d = load_drafter(str(drafter), target)
        d.set_tree(TreePolicy(TreeKind.BEAM, beam_width=width), K)
        drafters[f"{label}/rsd-s"], rules[f"{label}/rsd-s"] = d, VerifyRule.RSD
    return drafters, rules


def tau_se(row: ScoreRow) -> float:
    """Standard error of a row's τ over its rounds, from its per-position acceptance P(A >= i) of the accepted count
    A: Var A = Σ (2i - 1) P(A >= i) - (E A)² (rounds treated as independent)."""
    at = row.accept_at
    mean = sum(at)
    var = sum((2 * i + 1) * a for i, a in enumerate(at)) - mean**2
    return (max(var, 0.0) / max(1, row.rounds)) ** 0.5


def verdict(a: ScoreRow, b: ScoreRow) -> str:
    """Whether row ``a``'s τ is above row ``b``'s beyond twice the standard error of their difference."""
    diff, se = a.tau - b.tau, (tau_se(a) ** 2 + tau_se(b) ** 2) ** 0.5
    word = "above" if diff > 2 * se else "below" if diff < -2 * se else "within noise of"
    return f"{word} ({diff:+.2f} ± {se:.2f})"


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Multi-draft verification on the {result['target']} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; target "
        f"{result['dtype']}; load average before / after {result['load'][0]} / {result['load'][1]}). One EAGLE-3 "
        f"({result['steps']} steps, `val/tau_est` {result['val_tau_est']:.2f}) drafts every row; held-out prompts: "
        f"{result['num_prompts']} × {result['max_new_tokens']} new tokens; K = {K} (every tree has depth {K}). Each "
        "table is one run, every row interleaved per prompt with plain decoding of the same target. A shape "
        "`b1,b2,b3,b4` draws b_d candidates per node at depth d: `2,1,1,1` is two drafts of length 4, `4,1,1,1` "
        "four, `2,2,1,1` a 14-node tree. SpecInfer and SpecTr draw siblings i.i.d. (a repeated candidate verified "
        "once), RSD-C without replacement; RSD-S keeps a stochastic beam of 2 or 4 paths (at most K × width nodes). "
        "τ ± its standard error over rounds; a comparison is called only beyond twice the standard error of the "
        "difference.",
    ]
    for title, b in result["blocks"].items():
        plain, scored = read_block(b)
        rows = {r.name: r for r in scored}
        chain = rows["chain"]
        table = [
            "| shape | nodes | SpecInfer τ | SpecTr τ | RSD τ | SpecInfer × | SpecTr × | RSD × |",
            "|---|---|---|---|---|---|---|---|",
            f"| chain (one draft) | {K} | {chain.tau:.2f} ± {tau_se(chain):.2f} | – | – | {chain.speedup:.2f}× "
            "| – | – |",
        ]
        for label, branching in SHAPES.items():
            cells = [rows[f"{label}/{rule}"] for rule in VerifyRule]
            nodes = TreePolicy(TreeKind.SAMPLED, branching=branching).sampled_nodes(K)
            taus = " | ".join(f"{c.tau:.2f} ± {tau_se(c):.2f}" for c in cells)
            table.append(f"| {label} | {nodes} | {taus} | " + " | ".join(f"{c.speedup:.2f}×" for c in cells) + " |")
        for label, (width, _) in BEAMS.items():
            c = rows[f"{label}/rsd-s"]
            table.append(
                f"| RSD-S, {label} | ≤ {K * width} | – | – | {c.tau:.2f} ± {tau_se(c):.2f} | – | – | {c.speedup:.2f}× |"
            )
        claims = [
            f"- SpecTr's claim (k drafts of length {K} accept more per round than one draft): SpecTr with 2 drafts is "
            f"{verdict(rows['2,1,1,1/spectr'], chain)} the chain, with 4 drafts "
            f"{verdict(rows['4,1,1,1/spectr'], chain)} it.",
            "- RSD's claim (above SpecInfer on the same tree): "
            + "; ".join(f"{label} {verdict(rows[f'{label}/rsd'], rows[f'{label}/specinfer'])}" for label in SHAPES)
            + ".",
            "- RSD-S against RSD-C at the same budget: "
            + "; ".join(
                f"{label} {verdict(rows[f'{label}/rsd-s'], rows[f'{shape}/rsd'])} {shape}"
                for label, (_, shape) in BEAMS.items()
            )
            + ".",
        ]
        lines += ["", f"## {title}", "", *table, "", *claims, "", "### All rows", "", markdown_table(scored, plain)]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default", choices=["default", "smollm2"])
    parser.add_argument("--out", type=Path, default=None, help="default: runs/multidraft/<target>")
    parser.add_argument("--steps", type=int, default=None, help="EAGLE-3 steps (default: 150; SmolLM2: its recipe's)")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--samplings", nargs="+", default=["0.7:0.9", "1.0:1.0"], help="TEMPERATURE:TOP_P, one block each"
    )
    args = parser.parse_args()
    out = args.out or Path("runs/multidraft") / args.target
    load = Load()
    plan = replace(PLANS[args.target], drafters=("eagle3",), acceptance_head=False, draft_lm=False)
    resolved = resolve_target(plan.target(resolve(args.target)), quiet=True)
    data = make_data(resolved, out, plan.budget, plan)
    steps = args.steps or (None if args.target == "smollm2" else 150)
    drafter = train_drafter(plan.recipe("eagle3"), resolved, data, out, plan.budget, run=FitRun(steps=steps))
    target = load_target(resolved)
    prompts = prompt_ids(HELDOUT[args.target], target.tokenizer, args.num_prompts)
    blocks = {}
    for setting in args.samplings:
        temperature, top_p = (float(x) for x in setting.split(":"))
        sampling = Sampling(temperature, top_p)
        drafters, rules = drafters_for(target, drafter)

        def run(drafters=drafters, rules=rules, sampling=sampling) -> dict:
            plain, rows = score_drafters(target, drafters, prompts, K, sampling, args.max_new_tokens, verify=rules)
            return {"temperature": sampling.temperature, "top_p": sampling.top_p, **block_dicts(plain, rows)}

        path = out / "bench" / f"t{temperature}-p{top_p}-n{len(prompts)}.json"
        blocks[f"T = {temperature}, top-p {top_p}"] = saved_block(path, list(drafters), run)
    record = json.loads((drafter / "config.json").read_text())
    result = {
        "machine": machine(),
        "target": args.target,
        "dtype": target.dtype,
        "load": load.span(),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "steps": steps or recipe_steps(plan.recipe("eagle3"), plan.budget),
        "val_tau_est": record.get("val_tau_est") or 0.0,
        "blocks": blocks,
    }
    write(f"multidraft_{args.target}", result, markdown(result))


if __name__ == "__main__":
    main()
