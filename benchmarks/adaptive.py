"""SpecDec++ adaptive draft length vs fixed K, and online speculative decoding (OSD), on the default target.

Run: ``flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/adaptive.py --drafter DIR [--head DIR]``.

Part 1 (adaptive K): an acceptance head on a trained EAGLE-1 drafter (trained here on greedy
continuations of the built-in *training* prompts unless ``--head`` is given) drafts chains of up
to ``--max-k`` tokens, stopping once P(some token rejected) > threshold; the same drafter with
fixed K = 2, 4, 6 and plain decoding run interleaved, prompt by prompt, on held-out prompts.

Part 2 (OSD): the default target's sibling draft LM decodes held-out prompts in order while
learning from its rejected positions; a frozen copy decodes the same prompts in the same run, so
the change from the first to the last window of prompts can be told apart from the prompts'
own difficulty.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from common import machine, prompt_ids, write

from draftsmith import targets
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.decode.metrics import drafter_metrics, plain_metrics, prompt_windows
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.acceptance_head.network import load_adaptive
from draftsmith.families.acceptance_head.train import train_head
from draftsmith.families.online.drafter import OnlineConfig, OnlineDrafter
from draftsmith.families.specs import load_drafter
from draftsmith.targets import resolve_target


def interleaved(target: Target, decoders: dict, prompts: list[list[int]], new_tokens: int) -> tuple[list, dict]:
    """Plain decoding and every decoder on each prompt in turn (greedy); per-decoder results."""
    sampling = Sampling()
    plain_decode(target, prompts[0], 8, sampling)  # warm-up
    for dec in decoders.values():
        dec.generate(prompts[0], 8)
    plain, spec = [], {name: [] for name in decoders}
    for i, prompt in enumerate(prompts):
        plain.append(plain_decode(target, prompt, new_tokens, sampling))
        for name, dec in decoders.items():
            spec[name].append(dec.generate(prompt, new_tokens))
        print(f"\r  prompt {i + 1}/{len(prompts)}", end="", flush=True)
    print()
    return plain, spec


def adaptive_part(args, target: Target, target_dir: Path, prompts: list[list[int]]) -> dict:
    head = args.head
    head_info: dict = {"path": str(head) if head else None}
    if head is None:
        train = args.out / "data" / "train-greedy"
        if not (train / "draftsmith.json").exists():
            generate(resolve_target(str(target_dir)), "builtin:train", train, temperature=0.0, num_prompts=args.head_prompts,
                     max_new_tokens=args.new_tokens, overwrite=True)  # fmt: skip
        val = args.out / "data" / "val-greedy"
        if not (val / "draftsmith.json").exists():
            generate(resolve_target(str(target_dir)), "builtin:heldout", val, temperature=0.0, num_prompts=args.prompts,
                     max_new_tokens=args.new_tokens, overwrite=True)  # fmt: skip
        start = time.perf_counter()
        head, metrics = train_head(str(target_dir), str(args.drafter), str(train), str(val), args.out / "head",
                                   max_steps=args.head_steps, steps=args.max_k)  # fmt: skip
        head_info = {"path": str(head), "train_seconds": round(time.perf_counter() - start, 1),
                     "steps": args.head_steps, "train_prompts": args.head_prompts, "val": metrics}  # fmt: skip
    base = load_drafter(str(args.drafter), target)
    decoders = {f"fixed K={k}": SpeculativeDecoder(target, base, k, Sampling()) for k in args.fixed_k}
    for h in args.thresholds:
        decoders[f"adaptive h={h} (K≤{args.max_k})"] = SpeculativeDecoder(
            target, load_adaptive(str(head), target, h), args.max_k, Sampling()
        )
    plain, spec = interleaved(target, decoders, prompts, args.new_tokens)
    rows = []
    for name, dec in decoders.items():
        m = drafter_metrics(name, dec.k, spec[name], plain, True).to_dict()
        m["prompts"] = len(prompts)
        rows.append(m)
    best_fixed = max((r for r in rows if r["name"].startswith("fixed")), key=lambda r: r["tokens_per_s"])
    best_adaptive = max((r for r in rows if r["name"].startswith("adaptive")), key=lambda r: r["tokens_per_s"])
    verdict = best_adaptive["tokens_per_s"] / best_fixed["tokens_per_s"] - 1
    return {"head": head_info, "plain": plain_metrics(plain).to_dict(), "drafters": rows,
            "best_fixed": best_fixed["name"], "best_adaptive": best_adaptive["name"],
            "adaptive_vs_fixed": verdict}  # fmt: skip


def osd_part(args, target: Target, target_dir: Path, prompts: list[list[int]]) -> dict:
    sibling = args.osd_drafter or target_dir / "sibling"
    decoders = {"frozen": SpeculativeDecoder(target, load_drafter(str(sibling), target), args.osd_k, Sampling())}
    online = {}
    for lr in args.osd_lr:
        cfg = OnlineConfig(lr=lr, windows=args.windows)
        online[f"OSD lr={lr:g}"] = OnlineDrafter(load_drafter(str(sibling), target), target, cfg)
        decoders[f"OSD lr={lr:g}"] = SpeculativeDecoder(target, online[f"OSD lr={lr:g}"], args.osd_k, Sampling())
    plain, spec = interleaved(target, decoders, prompts, args.new_tokens)
    rows = []
    for name in decoders:
        m = drafter_metrics(name, args.osd_k, spec[name], plain, True).to_dict()
        m["online"] = online[name].online_report(spec[name]) if name in online else None
        m["windows"] = prompt_windows(spec[name], args.windows)
        rows.append(m)
    frozen = rows[0]["windows"]
    for r in rows:
        first, last = r["windows"][0]["alpha"], r["windows"][-1]["alpha"]
        r["alpha_change"] = last - first
        r["alpha_change_vs_frozen"] = last - first - (frozen[-1]["alpha"] - frozen[0]["alpha"])
    return {"drafter": str(sibling), "k": args.osd_k, "plain": plain_metrics(plain).to_dict(), "drafters": rows}


def adaptive_markdown(result: dict) -> str:
    part, args = result["adaptive"], result["args"]
    head, plain, rows = part["head"], part["plain"], part["drafters"]
    lines = [
        "| drafter | α | τ | mean drafted | tokens/s | speedup | greedy exact |",
        "|---|---|---|---|---|---|---|",
        f"| plain decoding | – | 1.00 | – | {plain['tokens_per_s']:.1f} | 1.00× | – |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['alpha']:.3f} | {r['tau']:.2f} | {r['mean_drafted']:.2f} | {r['tokens_per_s']:.1f} "
            f"| {r['speedup']:.2f}× | {r['greedy_exact']}/{r['prompts']} |"
        )
    val = head.get("val", {})
    return (
        "## SpecDec++ adaptive K vs fixed K\n\n"
        f"EAGLE-1 drafter `{args['drafter']}`; acceptance head `{head['path']}`"
        + (
            f" trained {head['steps']} steps ({head['train_seconds']:.0f} s) on greedy continuations of "
            f"{head['train_prompts']} built-in training prompts; held-out AUROC {val.get('auroc', float('nan')):.3f}, "
            f"held-out acceptance rate {val.get('accept_rate', float('nan')):.3f}"
            if "steps" in head
            else ""
        )
        + f". Greedy, {rows[0]['prompts']} held-out prompts × {args['new_tokens']} tokens, all rows interleaved prompt "
        "by prompt in one run.\n\n"
        + "\n".join(lines)
        + f"\n\nBest adaptive ({part['best_adaptive']}) vs best fixed ({part['best_fixed']}) in wall-clock: "
        f"{100 * part['adaptive_vs_fixed']:+.1f}% tokens/s.\n"
    )


def osd_markdown(result: dict) -> str:
    osd, args = result["osd"], result["args"]
    rows, prompts = osd["drafters"], int(args["prompts"])
    lines = ["| drafter | window (prompts) | α | τ | rounds |", "|---|---|---|---|---|"]
    summary = [
        "| drafter | α first window | α last window | change | vs frozen | updates | tokens/s | speedup | greedy exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for w in r["windows"]:
            lines.append(
                f"| {r['name']} | {w['prompts'][0] + 1}–{w['prompts'][1]} | {w['alpha']:.3f} | {w['tau']:.2f} | "
                f"{w['rounds']} |"
            )
    for r in rows:
        first, last = r["windows"][0]["alpha"], r["windows"][-1]["alpha"]
        updates = r["online"]["updates"] if r["online"] else 0
        summary.append(
            f"| {r['name']} | {first:.3f} | {last:.3f} | {last - first:+.3f} | {r['alpha_change_vs_frozen']:+.3f} | "
            f"{updates} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}× | {r['greedy_exact']}/{prompts} |"
        )
    return (
        "## Online speculative decoding (OSD)\n\n"
        f"Draft LM `{osd['drafter']}` (the default target's sibling: same corpus, not distilled), greedy, "
        f"K = {osd['k']}, {prompts} held-out prompts × {args['new_tokens']} tokens decoded in order, split into "
        f"{args['windows']} windows. OSD rows learn from their rejected positions (buffer of the latest 256, every 16 "
        "new ones 4 AdamW steps of forward KL to the target); the frozen row is the same model not learning, in the "
        "same run. Learning time counts in tokens/s.\n\n"
        + "\n".join(summary)
        + "\n\nPer window:\n\n"
        + "\n".join(lines)
        + "\n"
    )


def markdown(result: dict) -> str:
    m, args = result["machine"], result["args"]
    return (
        "# Adaptive draft length (SpecDec++) and online speculative decoding (OSD)\n\n"
        f"`{m['command']}` on {m['date']} (git {m['git']}, {m['platform']}, {args['threads']} torch thread(s))."
        + (f" {result['note']}" if result.get("note") else "")
        + "\n\n"
        + adaptive_markdown(result)
        + "\n"
        + osd_markdown(result)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--drafter", type=Path, default=Path("runs/quickstart/drafters/eagle1"))
    parser.add_argument("--head", type=Path, default=None, help="a trained head (default: train one here)")
    parser.add_argument("--head-steps", type=int, default=300)
    parser.add_argument("--head-prompts", type=int, default=600)
    parser.add_argument("--prompts", type=int, default=60, help="held-out prompts scored")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--fixed-k", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    parser.add_argument("--osd-drafter", type=Path, default=None, help="draft LM for OSD (default: the sibling)")
    parser.add_argument("--osd-k", type=int, default=4)
    parser.add_argument("--osd-lr", type=float, nargs="+", default=[3e-4, 1e-3])
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--note", default="", help="a sentence about the machine's state, for the report")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-adaptive"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target_dir = targets.resolve("default")
    target = Target.from_pretrained(target_dir)
    prompts = prompt_ids("builtin:heldout", target.tokenizer, args.prompts)
    adaptive = adaptive_part(args, target, target_dir, prompts)
    osd = osd_part(args, target, target_dir, prompts)
    info = machine()
    data = {"machine": info, "note": args.note, "target": target.fingerprint,
            "args": {k: str(v) for k, v in vars(args).items()}, "adaptive": adaptive, "osd": osd}  # fmt: skip
    write("adaptive", data, markdown(data))


if __name__ == "__main__":
    main()
