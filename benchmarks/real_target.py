"""Every drafter family on a real pretrained LLM: SmolLM2-135M-Instruct (``--target smollm2``).

    python benchmarks/real_target.py [--out runs/real_target] [--num-prompts 8] [--max-new-tokens 64]

Stages (each reused from ``--out`` when finished, so an interrupted run resumes):
1. the quickstart's SmolLM2 plan: on-policy data on the built-in chat prompts, the feature cache, EAGLE-3,
   EAGLE-1, Medusa-1, Hydra++, a distilled draft LM (from the target's first 2 layers) and a SpecDec++ head;
2. the verifier on held-out chat prompts, each block one interleaved run with plain decoding: greedy chains at
   each ``--ks`` (every family at K = 4, the short list at the others), the ``--trees`` at K = 4 (EAGLE-2 dynamic
   trees for EAGLE-3 and Hydra++, Medusa's static tree), and ``--sampled`` drafters at T = 0.7, top-p 0.9, K = 4;
3. HF transformers' own speculative decoding on the same prompts, interleaved with draftsmith's: ``generate``,
   prompt lookup (same N and K) and assisted generation with the same distilled draft LM (K constant, and HF's
   default schedule with its confidence threshold); greedy outputs checked against draftsmith's plain decoding;
4. the verification cost ratio r(K) = t(target forward of K+1 tokens) / t(one decode step) on a cached context
   (every score row also carries its own r, measured in its run, and the ideal speedup τ / (r + K̄·c)).
The defaults fit about an hour of scoring on 2 CPU cores; ``--ks 2 4 6 --trees eagle3-tree medusa1-tree
hydrapp-tree`` is the full plan.
Writes ``benchmarks/results/real_target.{json,md}`` and PNG plots beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
from common import RESULTS, machine, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval import plots
from draftsmith.eval.report import markdown_table
from draftsmith.eval.score import score_drafters, verify_ratios
from draftsmith.export.registry import write_export
from draftsmith.families.specs import load_drafter
from draftsmith.layers.tree_draft import TreeDrafter, TreePolicy
from draftsmith.targets import resolve
from draftsmith.train.suite import PLANS, make_data, train_all

CHAINS = ["ngram", "eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm", "draft_lm_undistilled", "eagle1-adaptive"]
SHORT_LIST = ["ngram", "eagle3", "eagle1", "draft_lm"]
"""Chains also scored at K = 2 and 6."""
TREES = {
    "eagle3-tree": ("eagle3", "dynamic"),
    "medusa1-tree": ("medusa1", "static"),
    "hydrapp-tree": ("hydrapp", "dynamic"),
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
        base, tree = TREES.get(name, (name, "chain"))
        d = load_drafter(spec(base, drafters), target)
        if isinstance(d, TreeDrafter):
            d.set_tree(TreePolicy(tree, 16, 4), k)
        out[name] = d
    return out


def scored(path: Path, run) -> dict:
    """A block's result, computed once (``run()``) and saved, so an interrupted benchmark resumes."""
    if path.is_file():
        return json.loads(path.read_text())
    result = run()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def block(target, names, drafters, prompts, k, sampling, max_new) -> dict:
    plain, rows = score_drafters(target, load(names, target, drafters, k), prompts, k, sampling, max_new)
    return {"k": k, "temperature": sampling.temperature, "top_p": sampling.top_p, "plain": plain, "drafters": rows}


def cost_ratios(target: Target, prompt: list[int], ks: list[int], repeats: int = 15) -> dict:
    """r(K): median time of a target forward of K+1 new tokens over one of 1 token, on the same cached context."""
    ratios, step = verify_ratios(target, prompt, [k + 1 for k in ks], repeats)
    return {k: round(ratios[k + 1], 3) for k in ks} | {"step_ms": round(1e3 * step, 1)}


@torch.no_grad()
def hf_baselines(target: Target, assistant_dir: Path, drafters: Path, prompts, k: int, max_new: int) -> dict:
    """HF ``generate`` / prompt lookup / assisted generation beside draftsmith's plain, n-gram and draft-LM
    decoding, interleaved per prompt, greedy. Returns per-row tokens/s and greedy-exact counts."""
    from transformers import AutoModelForCausalLM

    from draftsmith.eval.verifier import SpeculativeDecoder, plain_decode

    model, greedy = target.model, Sampling(0.0)
    assistant = AutoModelForCausalLM.from_pretrained(assistant_dir).eval()
    eos = list(target.eos_token_ids)
    base = {"do_sample": False, "max_new_tokens": max_new, "eos_token_id": eos, "pad_token_id": eos[0]}
    hf = {
        "hf generate": {},
        "hf prompt lookup": {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 3},
        "hf assisted (constant K, no threshold)": {
            "assistant_model": assistant,
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        "hf assisted (HF defaults)": {"assistant_model": assistant},
    }
    ours = {
        name: SpeculativeDecoder(target, load_drafter(spec(name, drafters), target), k, greedy)
        for name in ("ngram", "draft_lm")
    }
    seconds = {name: 0.0 for name in ["draftsmith plain", *[f"draftsmith {n}" for n in ours], *hf]}
    tokens = dict.fromkeys(seconds, 0)
    exact = dict.fromkeys(seconds, 0)
    for i, prompt in enumerate([prompts[0], *prompts]):  # the first pass warms up and is not counted
        ref = plain_decode(target, prompt, max_new, greedy, None)
        outs = {"draftsmith plain": (ref.tokens, ref.seconds)}
        for name, dec in ours.items():
            r = dec.generate(prompt, max_new)
            outs[f"draftsmith {name}"] = (r.tokens, r.seconds)
        for name, kwargs in hf.items():
            ids = torch.tensor([prompt])
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **base, **kwargs)
            outs[name] = (out[0, len(prompt) :].tolist(), time.perf_counter() - start)
        if i == 0:
            continue
        for name, (toks, secs) in outs.items():
            seconds[name] += secs
            tokens[name] += len(toks)
            exact[name] += int(toks == ref.tokens)
    return {
        name: {
            "tokens_per_s": round(tokens[name] / seconds[name], 2),
            "tokens": tokens[name],
            "greedy_exact": exact[name],
        }
        for name in seconds
    } | {"prompts": len(prompts), "k": k}


def markdown(result: dict) -> str:
    lines = [
        "# Every family on SmolLM2-135M-Instruct",
        "",
        f"`{result['machine']['command']}` at `{result['machine']['git']}` on {result['machine']['date']} "
        f"({result['machine']['platform']}, {result['machine']['threads']} threads; load average before / after "
        f"{result['load'][0]} / {result['load'][1]}). Held-out chat prompts: {result['num_prompts']} × "
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
        lines += ["", f"## {title}", "", markdown_table(b["drafters"], b["plain"]), ""]
    hf = result.get("hf")
    if not hf:
        return "\n".join([*lines, "", "(HF baselines not measured in this run.)", ""])
    lines += [
        "",
        f"## HF transformers' speculative decoding, same prompts, greedy, K = {hf['k']}",
        "",
        "| decoder | tokens/s | greedy = draftsmith plain |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {row['tokens_per_s']:.1f} | {row['greedy_exact']}/{hf['prompts']} |"
        for name, row in hf.items()
        if isinstance(row, dict)
    ]
    lines += ["", "![speedup](real_target_speedup.png) ![tau](real_target_tau_vs_k.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/real_target"))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[4], help="chain draft lengths (4 is always scored)")
    parser.add_argument("--trees", nargs="*", default=["eagle3-tree"], choices=list(TREES))
    parser.add_argument("--sampled", nargs="*", default=SAMPLED, help="drafters scored with T = 0.7, top-p 0.9")
    parser.add_argument("--blocks", nargs="+", default=["greedy", "sampled", "hf"], choices=["greedy", "sampled", "hf"])
    parser.add_argument("--skip-head", action="store_true", help="no SpecDec++ head (no eagle1-adaptive row)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    plan = replace(PLANS["smollm2"], acceptance_head=not args.skip_head)
    chains = [c for c in CHAINS if not (args.skip_head and c == "eagle1-adaptive")]
    target_dir = resolve("smollm2")
    data = make_data(target_dir, args.out, plan.budget, plan)
    train_all(target_dir, data, args.out, plan.budget, plan)
    drafters = args.out / "drafters"
    target = Target.from_pretrained(target_dir)
    prompts = [encode(p, target.tokenizer) for p in load_prompts(plan.prompts[1], limit=args.num_prompts)]
    greedy, sampled = Sampling(0.0), Sampling(0.7, 0.9)
    blocks, n = {}, args.max_new_tokens
    scores = args.out / "bench"
    for k in sorted({4, *args.ks}):
        names = chains + args.trees if k == 4 else SHORT_LIST
        title = f"greedy, K = {k}" + (", chains and trees" if k == 4 else "")
        blocks[title] = scored(
            scores / f"greedy-k{k}.json", lambda k=k, names=names: block(target, names, drafters, prompts, k, greedy, n)
        )
    if "sampled" in args.blocks:
        blocks["sampled T = 0.7, top-p 0.9, K = 4"] = scored(
            scores / "sampled-k4.json", lambda: block(target, args.sampled, drafters, prompts, 4, sampled, n)
        )
    hf = None
    if "hf" in args.blocks:
        assistant = args.out / "export" / "draft_lm-hf"
        if not (assistant / "config.json").is_file():
            write_export(drafters / "draft_lm", "hf", assistant, target=str(target_dir), overwrite=True)
        hf = scored(scores / "hf-k4.json", lambda: hf_baselines(target, assistant, drafters, prompts, 4, n))
    r = scored(scores / "r.json", lambda: cost_ratios(target, prompts[0], [2, 4, 6]))
    result = {
        "machine": machine(),
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "num_prompts": len(prompts),
        "max_new_tokens": n,
        "r": r,
        "blocks": blocks,
        "hf": hf,
        "training": {
            name: json.loads((drafters / name / "config.json").read_text()).get("val_tau_est")
            for name in ["eagle3", "eagle1", "medusa1", "hydrapp", "draft_lm"]
        },
    }
    k4 = blocks["greedy, K = 4, chains and trees"]
    plots.speedup_bars(k4["drafters"], k4["plain"], RESULTS / "real_target_speedup.png")
    by_k = {b["k"]: [d for d in b["drafters"] if d["name"] in SHORT_LIST] for t, b in blocks.items() if "greedy" in t}
    plots.tau_vs_k(by_k, RESULTS / "real_target_tau_vs_k.png")
    write("real_target", result, markdown(result))


if __name__ == "__main__":
    main()
