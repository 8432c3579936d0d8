"""Train EAGLE-3 and EAGLE-1 on the default target; compare ``val/tau_est`` with the verifier's τ.

Run: ``.venv/bin/python benchmarks/train.py [--steps 240] [--train-prompts 1000] [--score-prompts 20]``.
Both drafters train on the same on-policy data (the target's sampled continuations of built-in
prompts); the validation set is the target's greedy continuation of the held-out prompts the
verifier then scores, so the estimate and the measurement are on the same text.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from common import machine, prompt_ids, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.registry import load_network
from draftsmith.targets import default as default_target
from draftsmith.targets import resolve_target
from draftsmith.train.fit import FitRun
from draftsmith.train.suite import Budget, make_data, train_drafter


def markdown(result: dict) -> str:
    m, args = result["machine"], result["args"]
    lines = [
        "| drafter | steps | fit time | val/tau_est (best ckpt) | verifier τ (full rounds) | gap |",
        "|---|---|---|---|---|---|",
    ]
    plain, rows = read_block(result)
    for row in rows:
        fit = result["fits"][row.name]
        lines.append(
            f"| {row.name} | {fit['steps']} | {fit['seconds']:.0f} s | {fit['val_tau_est']:.3f} "
            f"| {row.tau_full:.3f} | {100 * fit['gap']:+.1f}% |"
        )
    return (
        "## EAGLE training on the default target\n\n"
        f"`{m['command']}` on {m['date']} ({m['platform']}, {m['threads']} threads).\n\n"
        + "\n".join(lines)
        + f"\n\n### Verifier, same run (greedy, K = {args['k']}, {args['score_prompts']} held-out prompts × "
        f"{args['new_tokens']} tokens)\n\n" + markdown_table(rows, plain)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--train-prompts", type=int, default=1000)
    parser.add_argument("--score-prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-train"))
    args = parser.parse_args()
    budget = Budget(args.train_prompts, args.new_tokens, args.score_prompts)
    run = FitRun(steps=args.steps, lr=0.002)  # every family at one learning rate, as measured before

    target_dir = default_target.build()
    resolved = resolve_target(target_dir, quiet=True)
    data = make_data(resolved, args.out, budget)
    target = Target.from_pretrained(target_dir)
    trained, fits = {}, {}
    for name in ("eagle3", "eagle1"):
        start = time.perf_counter()
        export = train_drafter(name, resolved, data, args.out, budget, force=True, run=run)
        seconds = time.perf_counter() - start
        network, info = load_network(export, target)
        trained[name] = network.as_drafter()
        fits[name] = {"seconds": round(seconds, 1), "steps": args.steps, "val_tau_est": info["val_tau_est"]}
    prompts = prompt_ids("builtin:heldout", target.tokenizer, args.score_prompts)
    plain, rows = score_drafters(target, trained, prompts, args.k, Sampling(), args.new_tokens)
    for row in rows:
        fit = fits[row.name]
        fit["verifier_tau_full"] = row.tau_full
        fit["gap"] = fit["val_tau_est"] / row.tau_full - 1
    data_out = {"machine": machine(), "target": target.fingerprint, "args": {k: str(v) for k, v in vars(args).items()},
                "fits": fits, **block_dicts(plain, rows), "threads": torch.get_num_threads()}  # fmt: skip
    md = markdown(data_out)
    write("train", data_out, md)


if __name__ == "__main__":
    main()
