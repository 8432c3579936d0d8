"""TLT: does a drafter trained on the rollouts keep up with a target being trained, and do its rollouts beat plain?

Run: ``flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/tlt.py [--target smollm2] [--steps 200]
[--update sft|grpo]``; ``--quick`` checks the mechanics end to end in under a minute (the default target, 2 steps,
written under ``--out``, not to ``benchmarks/results``).

The target (LoRA on every linear layer of its blocks) is trained on column-addition problems with worked solutions
(SFT, or GRPO on the answer's reward after ``--sft-steps`` of SFT); every step its rollouts are decoded by speculative
decoding (greedy: exact; sampled: lossless) with an EAGLE-1 drafter trained on the earlier rollouts' tokens and target
features (TLT's adaptive drafter), and, on measured steps, with a copy of that drafter frozen after its warm-up on the
initial target, and plainly. Reported per measured step: τ of both drafters, the rollouts' wall time with each and
plain, the target's reward; the goal (issue 55): after the drift, the adapted τ at least 1.3× the frozen one's, and
the rollouts with it faster than plain decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import RESULTS, fmt, machine, measured_on, write

from draftsmith.errors import DraftsmithError
from draftsmith.families.eagle.tlt.drafter import DrafterConfig
from draftsmith.families.eagle.tlt.policy import ALL_LINEAR, PolicyConfig
from draftsmith.families.eagle.tlt.task import ArithmeticTask
from draftsmith.families.eagle.tlt.train import RolloutConfig, TLTConfig, run_tlt
from draftsmith.layers.lora import Lora
from draftsmith.targets import load_target, resolve_target

QUICK = {"target": "default", "steps": 2, "warmup_steps": 1, "digits": 2, "problems": 2, "max_new_tokens": 12,
         "measure_every": 1, "drafter_steps": 2}  # fmt: skip
"""``--quick``'s settings: the mechanics of every stage, not a result."""


def markdown(result: dict) -> str:
    s, args, m = result["summary"], result["args"], result["machine"]
    lines = [
        "| step | update | τ adapted | τ frozen | adapted / frozen | reward | rollout tokens | wall s adapted "
        "| wall s frozen | wall s plain | drafter update s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["steps"]:
        if "frozen" not in r:
            continue
        a, f, p = r["adapted"], r["frozen"], r["plain"]
        lines.append(
            f"| {r['step']} | {r['rule']} | {a['tau']:.2f} | {f['tau']:.2f} | {a['tau'] / f['tau']:.2f}× "
            f"| {r['reward']:.2f} | {r['rollout_tokens']:.1f} | {a['seconds']:.1f} | {f['seconds']:.1f} "
            f"| {p['seconds']:.1f} | {r['drafter_update']['seconds']:.1f} |"
        )
    goal_tau = s["tau_ratio_tail"] is not None and s["tau_ratio_tail"] >= 1.3
    goal_speed = s["speedup_adapted"] is not None and s["speedup_adapted"] > 1.0
    load = result["load_average"]
    return (
        f"## TLT on {args['target']}: an adaptive drafter following a target being trained\n\n"
        f"{measured_on(m)}. Load average at the end {load[0]:.1f} (wall times are noisy where it is high; τ is not).\n\n"
        f"Target trained {args['steps']} steps ({args['update']}, LoRA r {args['lora_r']}, lr {args['lr']}) on "
        f"{args['problems']} addition problems of {args['digits']} digits per step; rollouts of up to "
        f"{args['max_new_tokens']} tokens, temperature {args['temperature']}, K = {args['k']}; the EAGLE-"
        f"{args['drafter_version']} drafter warmed up {args['warmup_steps']} steps on the initial target, then "
        f"{args['drafter_steps']} gradient steps per training step on its last {args['buffer']} rollouts; measured "
        f"every {args['measure_every']} steps.\n\n" + "\n".join(lines) + "\n\n"
        f"Second half of the run (steps {', '.join(map(str, s['tail_steps']))}): τ adapted "
        f"{fmt(s['tau_adapted_tail'])}, frozen {fmt(s['tau_frozen_tail'])}: **{fmt(s['tau_ratio_tail'])}×** "
        f"(goal ≥ 1.3×: {'met' if goal_tau else 'not met'}). Rollouts on measured steps: "
        f"{s['rollout_seconds']['adapted']:.1f} s with the adaptive drafter, {s['rollout_seconds']['frozen']:.1f} s "
        f"with the frozen one, {s['rollout_seconds']['plain']:.1f} s plain: **{fmt(s['speedup_adapted'])}×** plain "
        f"decoding's speed (goal > 1×: {'met' if goal_speed else 'not met'}; frozen {fmt(s['speedup_frozen'])}×). "
        f"The drafter's training took {s['drafter_update_seconds']:.1f} s in all, the target's "
        f"{s['policy_update_seconds']:.1f} s (TLT trains the drafter on GPUs the long tail leaves idle; here it runs "
        f"between steps, outside the rollout times). Reward {s['reward_first']:.2f} at the first step, "
        f"{s['reward_last']:.2f} at the last.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--update", choices=["sft", "grpo"], default="sft")
    parser.add_argument("--sft-steps", type=int, default=0, help="with --update grpo: SFT steps first")
    parser.add_argument("--lr", type=float, default=2e-3, help="the target's adapter")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="GRPO rollouts per problem")
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--problems", type=int, default=8, help="problems per step")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--measure-every", type=int, default=5)
    parser.add_argument("--drafter-version", type=int, default=1)
    parser.add_argument("--drafter-steps", type=int, default=8)
    parser.add_argument("--drafter-lr", type=float, default=3e-3)
    parser.add_argument("--buffer", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-tlt"))
    parser.add_argument("--results", type=Path, default=None, help="default: benchmarks/results (--quick: OUT)")
    parser.add_argument("--name", default=None, help="the results' file name (default tlt_TARGET[_quick][_grpo])")
    parser.add_argument("--quick", action="store_true", help="; ".join(f"{k} {v}" for k, v in QUICK.items()))
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    try:
        lora = Lora(r=args.lora_r, alpha=2 * args.lora_r, target_modules=ALL_LINEAR)
        policy = PolicyConfig(args.update, args.sft_steps, args.lr, lora, args.group)
        cfg = TLTConfig(
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            seed=args.seed,
            task=ArithmeticTask(args.digits, args.seed),
            policy=policy,
            drafter=DrafterConfig(args.drafter_version, None, args.drafter_lr, args.drafter_steps, buffer=args.buffer),
            rollout=RolloutConfig(args.problems, args.max_new_tokens, args.temperature, args.k, args.measure_every),
        )
        target = load_target(resolve_target(args.target, "float32"))
    except DraftsmithError as e:
        parser.exit(2, f"tlt.py: error: {e}\n")
    name = args.name or (
        f"tlt_{args.target}" + ("_quick" if args.quick else "") + ("_grpo" if args.update == "grpo" else "")
    )
    run = run_tlt(target, cfg, args.out)
    record = run.record
    data = {"machine": machine(), "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "target": target.fingerprint, "summary": record["summary"], "steps": record["steps"],
            "warmup": record["warmup"], "saved": record["saved"], "load_average": os.getloadavg()}  # fmt: skip
    results = args.results or (args.out / "results" if args.quick else RESULTS)
    write(name, data, markdown(data), results)


if __name__ == "__main__":
    sys.exit(main())
