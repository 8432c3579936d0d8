"""Does EAGLE-3 overtake EAGLE-1 on SmolLM2 with more training? The real-target benchmark's EAGLE-3 (100 steps) tied
EAGLE-1 (80 steps) at τ 1.35 while its val/tau_est was still rising; this trains both recipes for the same, longer
budget on the same data and feature cache, and scores them beside the benchmark's (greedy, K = 4, same held-out
prompts, one interleaved run).

    python benchmarks/longer_eagle3.py [--steps 300] [--families eagle3 eagle1] [--out runs/real_target]

Needs ``benchmarks/real_target.py``'s data, feature cache and EAGLE-1 under ``--out``. Writes
``benchmarks/results/longer_eagle3.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import draft_vocab_coverage, machine, write

from draftsmith.core.sampling import Sampling
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval import plots
from draftsmith.eval.report import markdown_table
from draftsmith.eval.rows import PlainRow, block_dicts, read_rows
from draftsmith.eval.score import score_drafters
from draftsmith.families.specs import Trained, build_drafter
from draftsmith.targets import load_target, resolve, resolve_target
from draftsmith.train.fit import FitRun, fit_export


def curve(root: Path) -> list[tuple[int, float]]:
    """(step, val/tau_est) of every validation of a fit (its CSV log)."""
    rows = [r for f in sorted(root.glob("csv/version_*/metrics.csv")) for r in plots.read_metrics(f)]
    return [(int(r["step"]), round(r["val/tau_est"], 4)) for r in rows if "val/tau_est" in r]


def markdown(result: dict) -> str:
    m, curves, coverage = result["machine"], result["val_tau_est_curves"], result["eagle3_draft_vocab_coverage"]
    names = list(result["fit_seconds"])
    return "\n".join(
        [
            "# EAGLE-3 trained longer on SmolLM2",
            "",
            f"`{m['command']}` at `{m['git']}` on {m['date']} "
            f"(load average before / after {result['load'][0]} / {result['load'][1]}). "
            + ", ".join(f"`{n}`: recipe `smollm2/{n.split('-')[0]}` for {result['steps']} steps" for n in names)
            + " (batch 8, from the feature cache; 0 s where an export of the same config was reused); `eagle3` / "
            "`eagle1`: the real-target benchmark's (100 / 80 steps). Same data, same held-out prompts.",
            "",
            "val/tau_est at each validation (step: τ_est):",
            "",
            *[f"- {n}: " + ", ".join(f"{s}: {v:.3f}" for s, v in c) for n, c in curves.items()],
            "",
            "EAGLE-3's 4,096-token draft vocabulary (the most frequent generated tokens of the training data) holds "
            + "; ".join(
                f"{c['covered']} / {c['tokens']} = {c['share']:.3f} of the {split} data's generated tokens "
                f"({c['distinct']} distinct)"
                for split, c in coverage.items()
            )
            + " (held-out: `val`, the scoring prompts' greedy continuations).",
            "",
            f"Greedy, K = 4, {result['num_prompts']} held-out chat prompts × {result['max_new_tokens']} tokens, "
            "interleaved:",
            "",
            markdown_table(read_rows(result["drafters"]), PlainRow.from_dict(result["plain"])),
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--families", nargs="+", default=["eagle3", "eagle1"], choices=["eagle3", "eagle1"])
    parser.add_argument("--out", type=Path, default=Path("runs/real_target"))
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    target_dir = resolve("smollm2")
    resolved = resolve_target(target_dir)
    data = args.out / "data"
    names, fit_seconds = [], {}
    for family in args.families:
        name = f"{family}-{args.steps}"
        run = FitRun(
            target=str(target_dir),
            train=str(data / "train"),
            val=str(data / "val"),
            features=str(data / "train-features"),
            out=args.out / "fit" / name,
            steps=args.steps,
            trainer={"enable_model_summary": False, "enable_progress_bar": False},
        )
        start = time.perf_counter()
        fit_export(f"smollm2/{family}", run, resolved, args.out / "drafters" / name)  # reused when current
        fit_seconds[name] = round(time.perf_counter() - start, 1)
        names.append(name)
    target = load_target(resolved)
    prompts = [encode(p, target.tokenizer) for p in load_prompts("builtin:chat-heldout", limit=args.num_prompts)]
    shown = ["eagle3", "eagle1", *names]
    drafters = {n: build_drafter(Trained(str(args.out / "drafters" / n)), target) for n in shown}
    plain, rows = score_drafters(target, drafters, prompts, 4, Sampling(0.0), args.max_new_tokens)
    curves = {n: curve(args.out / "fit" / n) for n in shown}
    coverage = {
        split: draft_vocab_coverage(args.out / "drafters" / "eagle3", data / split) for split in ("train", "val")
    }
    result = {
        "machine": machine(),
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "steps": args.steps,
        "fit_seconds": fit_seconds,
        "val_tau_est_curves": curves,
        "eagle3_draft_vocab_coverage": coverage,
        **block_dicts(plain, rows),
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
    }
    md = markdown(result)
    write("longer_eagle3", result, md)


if __name__ == "__main__":
    main()
