"""DSpark against DFlash, EAGLE-3 and the n-gram on SmolLM2-135M-Instruct, every drafter trained on the packed corpus.

    python benchmarks/dspark.py [--study runs/study] [--size 1M] [--out runs/dspark] [--num-prompts 32]
        [--max-new-tokens 128] [--lengths 1 2 3 4 6 8]

The drafters are the recipe study's fits on the repository's packed 1M-token corpus (``benchmarks/scaling.py --out
runs/study --sizes 1000000 --families eagle3 dflash dspark``): ``STUDY/drafters/{eagle3,dflash,dspark}-SIZE``, each
fit's record (steps, seconds, val τ_est) in ``STUDY/fit``. One greedy block per held-out set (MT-bench first turns,
N / 8 per category; chat-heldout), every decoder interleaved prompt by prompt with plain decoding of the target
(bf16 batch-invariant on a CPU with native bf16, else float32) in one run (``score_drafters``):

- at K = 4: the n-gram drafter (prompt lookup), EAGLE-3, DFlash, and DSpark with its confidence cut (the threshold
  recorded at training) and with the cut off (``confidence:0:``, the whole block, as DFlash drafts);
- on chat-heldout also DSpark's cut at its full depth, against the same drafter with the cut off at each fixed
  length of ``--lengths``: whether the confidence head's length is as fast as the best fixed one.

Each block is saved in ``--out`` once scored and reused, so an interrupted run resumes at the next block. Writes
``benchmarks/results/dspark_smollm2.{json,md}`` (``--results``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS, heldout_sets, machine, measured_at, measured_on, saved_block, write

from draftsmith.core.machine import native_bf16
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval import blocks
from draftsmith.eval.rows import read_block
from draftsmith.families.specs import Confident, Named, NGram, Trained
from draftsmith.targets import resolve
from draftsmith.train.recorded import fit_epochs

K = 4
FAMILIES = ("eagle3", "dflash", "dspark")


def specs(study: Path, size: str, lengths: list[int], depth: int, cut_sweep: bool) -> list[tuple[Named, int]]:
    """A block's (drafter, K) pairs."""
    path = {f: str(study / "drafters" / f"{f}-{size}") for f in FAMILIES}
    out = [
        (Named("ngram", NGram()), K),
        (Named("eagle3", Trained(path["eagle3"])), K),
        (Named("dflash", Trained(path["dflash"])), K),
        (Named("dspark", Trained(path["dspark"])), K),
        (Named(f"dspark fixed K={K}", Confident(path["dspark"], 0.0)), K),
    ]
    if cut_sweep:
        out.append((Named(f"dspark K={depth}", Trained(path["dspark"])), depth))
        out += [(Named(f"dspark fixed K={n}", Confident(path["dspark"], 0.0)), n) for n in lengths if n != K]
    return out


def score_block(target: Target, pairs: list[tuple[Named, int]], prompts, categories, max_new: int) -> dict:
    """The greedy block of ``pairs`` (``specs``), each drafter at its own K (``eval.blocks.score_block``)."""
    drafters = {named.name: named.spec for named, _ in pairs}
    ks = {named.name: k for named, k in pairs}
    return blocks.score_block(target, drafters, prompts, ks, Sampling(), max_new, categories)


def markdown(result: dict) -> str:
    lines = [
        "# DSpark against DFlash, EAGLE-3 and the n-gram on SmolLM2-135M-Instruct",
        "",
        f"{measured_on(result['machine'])}. Target `{result['target']}` ({result['dtype']}); drafters trained on the "
        f"packed corpus's first {result['size']} generated tokens (`{result['study']}`); {result['prompts']} prompts × "
        f"{result['max_new_tokens']} new tokens per set, greedy. Every row of a block was decoded in one run, "
        "interleaved prompt by prompt with plain decoding.",
        "",
        "| drafter | fit steps | epochs | fit s | val τ_est |",
        "|---|---|---|---|---|",
    ]
    for family, fit in result["fits"].items():
        tau = f"{fit['val_tau_est']:.2f}" if fit.get("val_tau_est") else "–"
        lines.append(f"| {family} | {fit['steps']} | {fit['epochs']} | {fit['seconds']:.0f} | {tau} |")
    lines += [
        "",
        "| set | drafter | K | drafted / round | τ | first-token acc. | speedup | greedy exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, block in result["blocks"].items():
        _, rows = read_block(block)
        for r in rows:
            first = f"{r.accept_at[0]:.2f}" if r.accept_at else "–"
            lines.append(
                f"| {key} | {r.name} | {r.k} | {r.mean_drafted:.2f} | {r.tau:.2f} | {first} | {r.speedup:.2f}× | "
                f"{r.greedy_exact}/{r.prompts} |"
            )
    lines += ["", "Plain decoding per block (tokens/s; load average before and after):", ""]
    for key, block in result["blocks"].items():
        plain, _ = read_block(block)
        lines.append(f"- {key}: {plain.tokens_per_s:.1f}; load {block['load']}{measured_at(block)}")
    lines += ["", "## Goals (issue 54)", ""]
    lines += [f"- {line}" for line in goals(result)]
    lines += [
        "",
        "dspark: its confidence head cuts each round's block where the predicted survival of the draft falls below the "
        "threshold recorded at training (drafted / round: the mean length it proposed). dspark fixed K=n: the same "
        "weights with the cut off, proposing n tokens every round. speedup: over plain decoding in the same block.",
    ]
    return "\n".join(lines) + "\n"


def goals(result: dict) -> list[str]:
    """Issue 54's goals with the blocks' figures."""
    out = []
    for key, block in result["blocks"].items():
        by = {r.name: r for r in read_block(block)[1]}
        dflash, cut, fixed = by["dflash"], by["dspark"], by[f"dspark fixed K={K}"]
        out.append(
            f"{key}: DSpark τ {fixed.tau:.2f} (cut off) / {cut.tau:.2f} (cut) against DFlash's {dflash.tau:.2f} at "
            f"K = {K}: {fixed.tau / dflash.tau:.2f}× / {cut.tau / dflash.tau:.2f}× (goal ≥ 1.15×); speed "
            f"{cut.speedup:.2f}× (cut) / {fixed.speedup:.2f}× (cut off) against DFlash's {dflash.speedup:.2f}× "
            f"(goal: faster)"
        )
        fixed_rows = [r for n, r in by.items() if n.startswith("dspark fixed")]
        cuts = [r for n, r in by.items() if n == "dspark" or n.startswith("dspark K=")]
        if len(fixed_rows) > 1:
            best = max(fixed_rows, key=lambda r: r.tokens_per_s)
            line = ", ".join(f"{r.name} at {r.tokens_per_s / best.tokens_per_s:.3f}×" for r in cuts)
            out.append(
                f"{key}: the best fixed length is K = {best.k} ({best.speedup:.2f}× plain); the confidence cut's "
                f"speed against it: {line} (goal within 5%, ≥ 0.95×)"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("runs/study"), help="the recipe study's --out")
    parser.add_argument("--size", default="1M", help="the subset the drafters were fitted on (their dirs' suffix)")
    parser.add_argument("--out", type=Path, default=Path("runs/dspark"))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8], help="fixed lengths to sweep")
    parser.add_argument("--results", default="dspark_smollm2")
    args = parser.parse_args()
    for family in FAMILIES:
        d = args.study / "drafters" / f"{family}-{args.size}"
        if not (d / "config.json").is_file():
            parser.error(
                f"{d}: no trained drafter (fit it first: python benchmarks/scaling.py --out {args.study} "
                f"--stages data features fit --sizes 1000000 --families {family})"
            )
    depth = json.loads((args.study / "drafters" / f"dspark-{args.size}" / "config.json").read_text())["config"]["depth"]
    dtype = "bfloat16" if native_bf16()[0] else "float32"
    target = Target.from_pretrained(resolve("smollm2"), dtype=dtype)
    sets = heldout_sets(target.tokenizer, args.num_prompts)
    blocks = {}
    for set_name, (prompts, categories) in sets.items():
        pairs = specs(args.study, args.size, args.lengths, depth, cut_sweep=set_name == "chat-heldout")
        blocks[set_name] = saved_block(
            args.out / f"{set_name}.json",
            [named.name for named, _ in pairs],
            lambda: score_block(target, pairs, prompts, categories, args.max_new_tokens),  # noqa: B023
        )
    fits = {}
    for family in FAMILIES:
        fit = json.loads((args.study / "fit" / f"{family}-{args.size}.json").read_text())
        fits[family] = fit | {"epochs": fit_epochs(fit)}
    result = {
        "machine": machine(),
        "target": "smollm2",
        "dtype": dtype,
        "study": str(args.study),
        "size": args.size,
        "prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "fits": fits,
        "blocks": blocks,
    }
    write(args.results, result, markdown(result), RESULTS)


if __name__ == "__main__":
    main()
