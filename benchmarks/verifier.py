"""Speedup of speculative over plain decoding on the default target, with the ideal bound beside it.

Run: ``.venv/bin/python benchmarks/verifier.py [--num-prompts 30] [--max-new-tokens 96]``.
Plain and speculative decoding of the same prompts are interleaved in one run.
"""

from __future__ import annotations

import argparse

from common import machine, prompt_ids, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import PlainRow, block_dicts, read_rows
from draftsmith.eval.score import score_drafters
from draftsmith.families.ngram.drafter import NGramDrafter
from draftsmith.layers.causal_lm import DraftLM
from draftsmith.targets import default as default_target


def markdown(result: dict) -> str:
    args, m = result["args"], result["machine"]
    sections = [
        f"### K = {r['k']}\n\n" + markdown_table(read_rows(r["drafters"]), PlainRow.from_dict(r["plain"]))
        for r in result["runs"]
    ]
    return (
        f"# Verifier benchmark\n\nDefault target, {args['num_prompts']} held-out prompts, greedy, "
        f"{args['max_new_tokens']} new tokens; `{m['command']}` on {m['date']} "
        f"({m['platform']}, {m['threads']} threads).\n\n" + "\n\n".join(sections) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    args = parser.parse_args()

    target_dir = default_target.build()
    target = Target.from_pretrained(target_dir)
    prompts = prompt_ids("builtin:heldout", target.tokenizer, args.num_prompts)
    drafters = {"ngram": NGramDrafter(), "draft-lm (1-layer sibling)": DraftLM.from_pretrained(target_dir / "sibling")}
    runs = []
    for k in args.ks:
        plain, rows = score_drafters(target, drafters, prompts, k, Sampling(), args.max_new_tokens)
        runs.append({"k": k, **block_dicts(plain, rows)})
    data = {"machine": machine(), "target": target.fingerprint, "args": vars(args), "runs": runs}
    md = markdown(data)
    write("verifier", data, md)


if __name__ == "__main__":
    main()
