"""Judge decoding on SmolLM2 (lossy by design): what it buys in speed and what it costs in answers that pass checks.

    python benchmarks/judge.py [--target smollm2] [--num-prompts 40] [--max-new-tokens 64] [-k 4]
        [--drafters ngram=ngram skip=skip:0.25] [--thresholds 0.9] [--label-tokens 48] [--label-batch 32]

Stages, each reused when done: (1) the judge (``draftsmith judge``: labels from the target's own alternatives on
``builtin:checkable-train``, each forced and continued by the target, checked; a logistic head on the target's final
hidden state; ``families/judge/train.py``; answers of ``--label-tokens``), in ``runs/judge/<target>/judge``; (2) scoring on ``builtin:checkable-heldout``
(short Python functions run against tests, and capitals; disjoint from the training tasks): plain decoding, each
drafter verified losslessly, and each under Judge decoding at the judge's own threshold (and at each of
``--thresholds``), greedy, interleaved per prompt in one run (``eval.score.score_drafters``). Every row counts its
answers that pass their checks: the quality Judge decoding gives up, beside the speed it buys. Writes
``benchmarks/results/judge.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import Load, machine, write

from draftsmith.core.sampling import Sampling
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval.rows import block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.judge import load_judge
from draftsmith.families.judge.train import JudgeConfig, train_judge
from draftsmith.families.specs import build_drafter, parse_spec
from draftsmith.targets import load_target, resolve_target

TRAIN, HELDOUT = "builtin:checkable-train", "builtin:checkable-heldout"


def markdown(data: dict) -> str:
    m, judge = data["machine"], data["judge"]
    plain, rows = read_block(data)
    lines = [
        "# Judge decoding on SmolLM2: speed bought, answers lost",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; target "
        f"{data['dtype']}; load average before / after {data['load'][0]} / {data['load'][1]}). "
        f"{data['num_prompts']} held-out prompts of `{HELDOUT}` (half short Python functions run against tests, half "
        f"capitals) × {data['max_new_tokens']} new tokens, K = {data['k']}, greedy, interleaved per prompt. "
        f"Judge: {judge['labels']} labels from {judge['prompts']} training prompts ({judge['method']}; "
        f"{judge['correct_share']:.0%} correct; made in {judge['label_seconds']:.0f} s); on the held-out quarter of "
        f"those prompts AUC {judge['val_auc']:.3f} (L2 {judge.get('l2', '–')}, chosen by that AUC), and at its "
        f"threshold {judge['threshold']:.3f} it accepts "
        f"{judge['val_true_accept']:.0%} of correct and {judge['val_false_accept']:.0%} of incorrect alternatives. "
        "Lossy rows are Judge decoding: never exact by design; checks passed counts answers whose code passes its "
        "tests or that name the capital.",
        "",
        "| row | lossy | threshold | τ | accepted by the judge | tokens/s | speedup | greedy exact | checks passed |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| plain decoding | no | – | 1.00 | – | {plain.tokens_per_s:.1f} | 1.00× | – | "
        f"{plain.checks_passed}/{plain.checked} |",
    ]
    for r in rows:
        judged = f"{r.judged_share:.0%} of kept" if r.lossy else "–"
        threshold = r.extra["threshold"] if r.lossy else "–"  # the benchmark's addition to judged rows
        lines.append(
            f"| {r.name} | {'yes' if r.lossy else 'no'} | {threshold} | {r.tau:.2f} | "
            f"{judged} | {r.tokens_per_s:.1f} | {r.speedup:.2f}× | "
            f"{r.greedy_exact}/{r.prompts} | {r.checks_passed}/{r.checked} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2", help="auto dtype: bf16 where this CPU multiplies it natively")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--drafters", nargs="+", default=["ngram=ngram", "skip=skip:0.25"])
    parser.add_argument("--thresholds", nargs="*", type=float, default=[], help="more judge thresholds to score")
    parser.add_argument("--label-tokens", type=int, default=48, help="answer length labelled (judge training)")
    parser.add_argument("--label-batch", type=int, default=32, help="forced continuations generated together")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path("runs/judge") / args.target.replace(":", "-")
    target = load_target(resolve_target(args.target))
    record = train_judge(
        target,
        load_prompts(TRAIN),
        out / "judge",
        JudgeConfig(max_new_tokens=args.label_tokens, batch_size=args.label_batch),
    )
    prompts = load_prompts(HELDOUT, limit=args.num_prompts)
    ids = [encode(p, target.tokenizer) for p in prompts]
    specs = [parse_spec(s) for s in args.drafters]
    drafters, judges = {}, {}
    for spec in specs:
        drafters[spec.name] = build_drafter(spec.spec, target)
        for threshold in [None, *args.thresholds]:
            head = load_judge(out / "judge", target, threshold)
            name = f"{spec.name}+judge" + ("" if threshold is None else f"@{threshold}")
            drafters[name], judges[name] = build_drafter(spec.spec, target), head
    load = Load()
    plain, rows = score_drafters(target, drafters, ids, args.k, Sampling(0.0), args.max_new_tokens,
                                 judges=judges, checks=[p.check for p in prompts])  # fmt: skip
    for row in rows:
        if row.name in judges:
            row.extra["threshold"] = round(judges[row.name].threshold, 4)
    data = {
        "machine": machine(),
        "target": args.target,
        "dtype": target.dtype,
        "num_prompts": len(ids),
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "judge": record,
        **block_dicts(plain, rows),
        "load": load.span(),
    }
    (out / "result.json").write_text(json.dumps(data, indent=2) + "\n")
    write("judge", data, markdown(data))


if __name__ == "__main__":
    main()
