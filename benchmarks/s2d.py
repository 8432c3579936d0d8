"""S2D: one sorted draft LM for three targets of one family, against one distilled draft LM per target.

Run: ``flock /tmp/draftsmith-bench.lock .venv/bin/python benchmarks/s2d.py [--steps 150] [--score-prompts 20]``
(``--quick``: a tiny end-to-end run, random tiny targets, in about a minute, written under ``--out`` only).

Targets: the default target's family at 2, 4 and 8 layers (``default-2``, ``default-4`` = ``default``,
``default-8``; ``--targets`` takes any that share a tokenizer). Each target generates its own training data (sampled
continuations of built-in prompts) and validation data (greedy continuations of the held-out prompts it is scored on).
One draft LM of ``--student-layers`` layers is pre-trained on the corpus (FastDraft's first stage; skipped with
``--quick``, which starts from one fresh draft), and from that same checkpoint:

- **per target**: a draft LM distilled on that target's data alone, ``--steps`` optimizer steps of ``--batch-size``
  sequences;
- **S2D**: one sorted draft LM (sub-networks: its first 1, 2, ... layers) distilled on every target's data at once,
  ``|T| x --steps`` optimizer steps of ``--batch-size / |T|`` sequences of each target: the same total optimizer steps,
  sequences, target forwards and draft-LM forwards as the per-target draft LMs together.

Each target is then scored on its held-out prompts, greedy and at T = 0.7 (lossless sampling), K = ``--k``, with its
per-target draft LM, the sorted draft LM (``score`` picking its sub-network for the target by the measured cost model,
``families/s2d/exits.py``), and each sub-network alone. The goal: S2D's τ within 5% of the per-target draft LM's on each target.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from common import machine, measured_on, write
from transformers import AutoConfig, AutoTokenizer

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.prompts import encode, load_prompts
from draftsmith.eval.rows import block_dicts, read_block
from draftsmith.eval.score import score_drafters
from draftsmith.families.draft_lm.train import DraftLMBudget, pretrain
from draftsmith.families.registry import load_network, load_trained
from draftsmith.families.student import StudentShape
from draftsmith.targets import resolve, resolve_target
from draftsmith.train.fit import FitRun, fit, fit_export
from draftsmith.train.suite import Budget, make_data

TEMPERATURES = {"greedy": 0.0, "T0.7": 0.7}


def quick_family(root: Path) -> list[Path]:
    """Three tiny random Llama targets (1, 2, 3 layers) sharing a small BPE tokenizer trained on a few corpus files:
    the mechanics of the benchmark in seconds, no τ worth reading."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftsmith.targets import corpus
    from draftsmith.targets.default import train_tokenizer

    dirs = [root / f"tiny-{n}" for n in (1, 2, 3)]
    if all((d / "config.json").is_file() for d in dirs):
        return dirs
    tokenizer = train_tokenizer(corpus.split(5)[0][:40], 384)
    for n, d in zip((1, 2, 3), dirs, strict=True):
        torch.manual_seed(n)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=n,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
            eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ))  # fmt: skip
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)  # peaked distributions, like a trained LM's
        model.save_pretrained(d)
        tokenizer.save_pretrained(d)
    return dirs


def phase(what: str, started: float) -> None:
    print(f"s2d benchmark: {what} after {time.perf_counter() - started:.0f} s (cpu {time.process_time():.0f} s)")


def trainer_args(args: argparse.Namespace, root: Path) -> dict:
    """The fits' trainer settings (``--quick``: a CSV log only, no wandb start-up per fit)."""
    quiet = {"enable_model_summary": False, "enable_progress_bar": not args.quick}
    if not args.quick:
        return quiet
    csv = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root), "name": "csv"}}
    return quiet | {"logger": [csv]}


def pretrained(args: argparse.Namespace, target_dir: Path, val: Path) -> Path:
    """The shared start: a fresh draft LM pre-trained on the corpus (``families.draft_lm.train.pretrain``, against the first
    target), saved as a plain HF dir with the targets' tokenizer, which every target's fit takes as ``init`` (a
    checkpoint would be refused for the other targets: it records the first one's fingerprint)."""
    budget = DraftLMBudget(shape=shape(args), pretrain_steps=args.pretrain_steps, lr=args.lr * 3)
    checkpoint = pretrain(resolve_target(target_dir, quiet=True), val, args.out, budget)
    out = args.out / "drafters" / "pretrained-hf"
    network = load_network(checkpoint, Target.from_pretrained(target_dir))[0]
    network.merged().model.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)
    return out


def fit_common(args: argparse.Namespace, init: Path | None) -> dict:
    """What both kinds of fit share: the start, the loss, the learning rate."""
    start = {"init": str(init)} if init is not None else {"init": None, "shape": asdict(shape(args))}
    return {"model": {**start, "loss": args.loss}, "lr": args.lr}


def shape(args: argparse.Namespace) -> StudentShape:
    return StudentShape(
        layers=args.student_layers, hidden=args.student_hidden, heads=2, intermediate=3 * args.student_hidden
    )


def per_target(args, name: str, target_dir: Path, data: tuple[Path, Path], init: Path | None) -> Path:
    """A draft LM distilled on this target's data alone: ``--steps`` steps of ``--batch-size`` sequences."""
    common = fit_common(args, init)
    common["model"]["on_policy"] = 0.0  # off-policy, as the sorted draft LM is distilled
    run = FitRun(target=str(target_dir), train=str(data[0]), val=str(data[1]), out=args.out / "fit" / f"draft_lm-{name}",
                 steps=args.steps, batch_size=args.batch_size, lr=common["lr"], model=common["model"],
                 trainer=trainer_args(args, args.out / "fit" / f"draft_lm-{name}"))  # fmt: skip
    return fit_export(
        "draft_lm", run, resolve_target(target_dir, quiet=True), args.out / "drafters" / f"draft_lm-{name}", force=True
    )


def sorted_fit(args, target_dirs: list[Path], data: list[tuple[Path, Path]], init: Path | None) -> Path:
    """The sorted draft LM on every target's data: |T| x ``--steps`` steps of ``--batch-size`` / |T| of each."""
    common = fit_common(args, init)
    n = len(target_dirs)
    model = {
        **common["model"],
        "targets": [str(d) for d in target_dirs],
        "exits": list(range(1, args.student_layers + 1)),
    }
    if init is not None:
        model["exits"] = list(range(1, AutoConfig.from_pretrained(init).num_hidden_layers + 1))
    run = FitRun(out=args.out / "fit" / "s2d", steps=n * args.steps, lr=common["lr"], model=model,
                 data={"train": [str(d[0]) for d in data], "val": [str(d[1]) for d in data],
                       "batch_size": args.batch_size // n},
                 trainer=trainer_args(args, args.out / "fit" / "s2d"))  # fmt: skip
    return fit("s2d", run).best


def markdown(result: dict) -> str:
    m, args = result["machine"], result["args"]
    lines = [
        "| target | decoding | drafter | sub-network | τ | τ / per-target | speedup | greedy exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in result["targets"].items():
        for mode, block in t["scores"].items():
            _, rows = read_block(block)
            base = next(r for r in rows if r.name == "per-target draft LM").tau
            for r in rows:
                layers = r.extra["s2d"]["layers"] if "s2d" in r.extra else r.extra.get("layers", "–")
                exact = f"{r.greedy_exact}/{r.prompts}" if mode == "greedy" else "–"
                lines.append(f"| {name} | {mode} | {r.name} | {layers} | {r.tau:.3f} | {r.tau / base:.3f} "
                             f"| {r.speedup:.2f}× | {exact} |")  # fmt: skip
    fits = result["fits"]
    goal = [f"{name} {mode}: {g:.3f}" for name, t in result["targets"].items() for mode, g in t["s2d_ratio"].items()]
    top = fits["s2d"]["exits"][-1]
    deepest = f"S2D sub-network {top} alone"
    same_depth = []
    for name, t in result["targets"].items():
        for mode, block in t["scores"].items():
            by = {r.name: r.tau for r in read_block(block)[1]}
            same_depth.append(f"{name} {mode}: {by[deepest] / by['per-target draft LM']:.3f}")
    return (
        "## S2D: one sorted draft LM for three targets vs one draft LM per target\n\n"
        f"{measured_on(m)}.\n\n"
        f"Draft: {args['student_layers']} layers (sub-networks {fits['s2d']['exits']}), "
        + (
            f"pre-trained {args['pretrain_steps']} steps on the corpus, then "
            if args["pretrain_steps"] != "0"
            else "from one fresh init, then "
        )
        + f"distilled ({args['loss']}): S2D {fits['s2d']['steps']} steps × {fits['s2d']['batch_per_target']} sequences "
        f"of each of {len(result['targets'])} targets ({fits['s2d']['seconds']:.0f} s); each per-target draft LM "
        f"{args['steps']} steps × {args['batch_size']} sequences of its target "
        f"({sum(f['seconds'] for f in fits['per_target'].values()):.0f} s for all). Scored on each target's "
        f"{result['scored_prompts']} held-out prompts × {args['new_tokens']} tokens, K = {args['k']}.\n\n"
        + "\n".join(lines)
        + "\n\nS2D τ / per-target τ (goal ≥ 0.95): "
        + ", ".join(goal)
        + f". At the per-target draft LM's own depth (sub-network {top}, the "
        "same layers): "
        + ", ".join(same_depth)
        + (" (--quick: random tiny targets, mechanics only)" if result["quick"] else "")
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", nargs="+", default=["default-2", "default-4", "default-8"])
    parser.add_argument("--steps", type=int, default=150, help="each per-target draft LM's steps (S2D: |T| times)")
    parser.add_argument("--batch-size", type=int, default=12, help="per-target sequences per step (S2D: / |T| each)")
    parser.add_argument("--student-layers", type=int, default=3)
    parser.add_argument("--student-hidden", type=int, default=128)
    parser.add_argument("--pretrain-steps", type=int, default=None, help="corpus pre-training (default 300; --quick 0)")
    parser.add_argument("--loss", default="fkl")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--train-prompts", type=int, default=600)
    parser.add_argument("--score-prompts", type=int, default=20, help="held-out prompts: validation and scoring")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-s2d"))
    parser.add_argument("--quick", action="store_true", help="tiny random targets and budgets, results under --out")
    args = parser.parse_args()
    if args.pretrain_steps is None:
        args.pretrain_steps = 0 if args.quick else 300
    if args.quick:
        torch.set_num_threads(1)  # tiny models gain nothing from intra-op threads and lose much on a busy machine
        args.steps, args.batch_size, args.student_layers, args.student_hidden = 2, 3, 2, 32
        args.train_prompts, args.score_prompts, args.new_tokens = 6, 2, 8
    count = 3 if args.quick else len(args.targets)
    if args.batch_size % count:  # before any target is built
        parser.error(f"--batch-size {args.batch_size} must divide among the {count} targets")
    started = time.perf_counter()
    target_dirs = quick_family(args.out / "targets") if args.quick else [resolve(t) for t in args.targets]
    names = [d.name for d in target_dirs] if args.quick else args.targets
    budget = Budget(args.train_prompts, args.new_tokens, args.score_prompts)
    data = [
        make_data(resolve_target(d, quiet=True), args.out / "data" / name, budget)
        for d, name in zip(target_dirs, names, strict=True)
    ]
    phase("data", started)
    init = pretrained(args, target_dirs[0], data[0][1]) if args.pretrain_steps else None
    fits: dict = {"per_target": {}}
    drafters = {}
    for name, d, dd in zip(names, target_dirs, data, strict=True):
        start = time.perf_counter()
        drafters[name] = per_target(args, name, d, dd, init)
        fits["per_target"][name] = {"seconds": round(time.perf_counter() - start, 1), "steps": args.steps}
    phase("per-target draft LMs", started)
    start = time.perf_counter()
    s2d_ckpt = sorted_fit(args, target_dirs, data, init)
    record = torch.load(s2d_ckpt, map_location="cpu", weights_only=False)["draftsmith"]
    fits["s2d"] = {"seconds": round(time.perf_counter() - start, 1), "steps": len(target_dirs) * args.steps,
                   "batch_per_target": args.batch_size // len(target_dirs), "exits": record["config"]["exits"],
                   "val_tau_est_pairs": record.get("val_tau_est_pairs"), "checkpoint": str(s2d_ckpt)}  # fmt: skip
    phase("sorted draft LM", started)
    prompts_text = load_prompts("builtin:heldout", limit=args.score_prompts)
    result_targets = {}
    for name, d in zip(names, target_dirs, strict=True):
        target = Target.from_pretrained(d)
        prompts = [encode(p, target.tokenizer) for p in prompts_text]
        sorted_drafter = load_trained(s2d_ckpt, target)
        network = load_network(s2d_ckpt, target)[0]
        scores, ratios = {}, {}
        for mode, temperature in TEMPERATURES.items():
            candidates = {
                "per-target draft LM": load_trained(drafters[name], target),
                "S2D (sub-network by score)": sorted_drafter,
            }
            candidates |= {f"S2D sub-network {n} alone": network.subnetwork(n).as_drafter() for n in network.exits}
            plain, rows = score_drafters(target, candidates, prompts, args.k, Sampling(temperature), args.new_tokens,
                                         progress=not args.quick)  # fmt: skip
            for r in rows:
                if r.name.startswith("S2D sub-network"):
                    r.extra["layers"] = int(r.name.split()[2])
            scores[mode] = block_dicts(plain, rows)
            by = {r.name: r.tau for r in rows}
            ratios[mode] = round(by["S2D (sub-network by score)"] / by["per-target draft LM"], 4)
        phase(f"scored {name}", started)
        result_targets[name] = {"fingerprint": target.fingerprint, "params": sum(p.numel() for p in target.model.parameters()),
                                "scores": scores, "s2d_ratio": ratios}  # fmt: skip
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "quick": args.quick,
              "fits": fits, "targets": result_targets, "scored_prompts": len(prompts_text),
              "seconds": round(time.perf_counter() - started, 1), "load_average": os.getloadavg()}  # fmt: skip
    if args.quick:  # mechanics only: never over the benchmark's results
        write("s2d_quick", result, markdown(result), args.out)
    else:
        write("s2d", result, markdown(result))


if __name__ == "__main__":
    main()
