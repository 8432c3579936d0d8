"""Training throughput of a feature drafter, from the feature cache and online: tokens/s of one optimizer step, per
variant.

    python benchmarks/train_throughput.py --data runs/real_target_bf16/data/train \
        [--features runs/real_target_bf16/data/train-features] [--family eagle3] [--steps 12] [--results NAME]

The same batches (the training sampler's, length-bucketed) go through every variant, interleaved step by step, so
each ratio is measured on the same work under the same machine load. Variants:
- ``full-vocab fp32``: the target's logits over its whole vocabulary from the cached final state (what training
  computed before), then the draft vocabulary's; the drafter in float32;
- ``draft-vocab fp32``: only the draft vocabulary's logits (``DrafterModule.loss_vocab``): the same loss;
- ``draft-vocab bf16``: the same under bf16 autocast (Lightning's ``bf16-mixed``), where the CPU multiplies bf16
  natively;
- ``online``: no feature cache: the target runs in the step (``--online`` of ``benchmarks/scaling.py``), the
  draft vocabulary's logits, in the drafter's precision of the fits (bf16 autocast where native, else float32).
Without ``--features`` the cached variants read hidden states that the target computed for the batch before the
step (untimed, stored in the cache's dtype as ``cache_features`` stores them), and the target's forward is timed on
its own: what building the cache costs per batch, its disk writes aside. So one run says which is cheaper for a
study of N fits: building the cache once, or the target in every step.
Also reported: the share of a batch's positions that are padding (what packing sequences could save at most).
Writes ``benchmarks/results/train_throughput.{json,md}``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from common import Load, machine, write

from draftsmith.core.machine import native_bf16
from draftsmith.families.eagle.module import EagleModule
from draftsmith.train.data import GeneratedDataModule

VARIANTS = {
    "full-vocab fp32": (False, False, False),
    "draft-vocab fp32": (True, False, False),
    "draft-vocab bf16": (True, True, False),
    "online": (True, native_bf16()[0], True),
}
"""variant -> (draft-vocabulary logits only, bf16 autocast, the target run in the step)."""


def cached(module: EagleModule, batch: dict, dtype: torch.dtype) -> tuple[dict, float]:
    """``batch`` with the target's hidden states as the feature cache holds them (the feature layers and the final
    normed state, stored in ``dtype``), and the seconds the target's forward took."""
    target = module.target
    layers = (*target.feature_layers, target.num_layers)
    start = time.perf_counter()
    with torch.no_grad():
        out = target(
            batch["input_ids"], attention_mask=batch["attention_mask"], feature_layers=layers, last_logits_only=True
        )
    seconds = time.perf_counter() - start
    return {**batch, "hidden": {layer: f.to(dtype) for layer, f in zip(layers, out.features, strict=True)}}, seconds


def step(module: EagleModule, opt, batch: dict, restrict: bool, bf16: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        out = module.target_forward(batch, module.loss_vocab() if restrict else None)
        loss = module.losses(batch, out)["loss"]
    loss.backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - start


def markdown(result: dict) -> str:
    m = result["machine"]
    source = (
        f"cached variants read the feature cache `{result['features']}`"
        if result.get("features")
        else f"cached variants read hidden states the target computed for the batch before the step (untimed), "
        f"stored in {result.get('cache_dtype', 'bfloat16')} as the cache stores them"
    )
    lines = [
        f"# Training throughput: {result['family']} from the feature cache"
        + (" and online" if "online" in result["variants"] else ""),
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m.get('cpu', m['platform'])}"
        f"{', ' + ', '.join(m['cpu_flags']) if m.get('cpu_flags') else ''}; {m['threads']} threads; load average "
        f"before / after {result['load'][0]} / {result['load'][1]}). {result['steps']} steps of batch "
        f"{result['batch_size']} (max length {result['max_length']}) per variant, interleaved step by step on the same "
        f"batches; {result['tokens']:,} real tokens per variant. Padding: {100 * result['padding']:.1f}% of the "
        "batches' positions (length-bucketed batches; packing could save at most that)."
        + (f" Target {result['target']}; {source}." if "target" in result else ""),
        "",
        "| variant | ms / step (median) | tokens / s | vs full-vocab fp32 |",
        "|---|---|---|---|",
    ]
    base = result["variants"]["full-vocab fp32"]["tokens_per_s"]
    for name, v in result["variants"].items():
        lines.append(f"| {name} | {v['ms_per_step']:.0f} | {v['tokens_per_s']:.0f} | {v['tokens_per_s'] / base:.2f}× |")
    forward, online = result.get("target_forward"), result["variants"].get("online")
    if forward:
        lines.append(
            f"| target forward alone (the cache's cost) | {forward['ms_per_batch']:.0f} | "
            f"{forward['tokens_per_s']:.0f} | |"
        )
    if forward and online:
        cached = max(
            (v for n, v in result["variants"].items() if n.startswith("draft-vocab")), key=lambda v: v["tokens_per_s"]
        )
        extra = 1 / online["tokens_per_s"] - 1 / cached["tokens_per_s"]  # seconds per token a pass pays online
        build = 1 / forward["tokens_per_s"]  # seconds per token the cache costs once (its disk writes aside)
        lines += [
            "",
            f"Online, a pass over the data costs {1e3 * extra:.2f} ms per token more than from the cache; building "
            f"the cache costs {1e3 * build:.2f} ms per token once (its disk writes aside): "
            + (
                f"the cache pays for itself after {build / extra:.1f} passes over the corpus, all fits together "
                "(a 2-epoch fit is 2)."
                if extra > 0
                else "online is no slower here, so the cache never pays."
            ),
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--features", type=Path, help="its feature cache (default: computed per batch, untimed)")
    parser.add_argument("--target", default="smollm2:bfloat16")
    parser.add_argument("--family", default="eagle3", choices=["eagle3", "eagle1"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--results", default="train_throughput", help="results name under benchmarks/results")
    args = parser.parse_args()
    load = Load()
    data = GeneratedDataModule(  # val is unused here (the module needs one beside a feature cache)
        str(args.data),
        str(args.data),
        batch_size=args.batch_size,
        max_length=args.max_length,
        features=str(args.features) if args.features else None,
    )
    data.setup()
    version = 3 if args.family == "eagle3" else 1
    extra = {"draft_vocab_size": 4096, "ttt_steps": 3} if version == 3 else {}
    variants = {n: v for n, v in VARIANTS.items() if not v[1] or native_bf16()[0] or v[2]}
    modules, opts = {}, {}
    for name in variants:
        torch.manual_seed(0)
        modules[name] = EagleModule(args.target, version=version, **extra)
        modules[name].prepare_from_data(data)
        opts[name] = torch.optim.AdamW(modules[name].drafter.parameters(), lr=1e-3)
    target = next(iter(modules.values())).target
    store = getattr(torch, target.dtype) if target.dtype in ("float16", "bfloat16") else torch.bfloat16
    batches = iter(data.train_dataloader())
    times = {n: [] for n in variants}
    forwards = []
    tokens = padded = 0
    for i in range(args.steps + 2):  # two warm-up steps
        batch = next(batches)
        online = {k: v for k, v in batch.items() if k != "hidden"}
        if "hidden" not in batch:
            batch, seconds = cached(modules["draft-vocab fp32"], batch, store)
            forwards.append(seconds)
        for name, (restrict, bf16, live) in variants.items():
            t = step(modules[name], opts[name], online if live else batch, restrict, bf16)
            if i >= 2:
                times[name].append(t)
        if i >= 2:
            tokens += int(batch["attention_mask"].sum())
            padded += batch["attention_mask"].numel()
    result = {
        "machine": machine(),
        "load": load.span(),
        "family": args.family,
        "target": f"{args.target} ({target.dtype})",
        "features": str(args.features) if args.features else None,
        "cache_dtype": str(store).removeprefix("torch."),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "tokens": tokens,
        "padding": round(1 - tokens / padded, 4),
        "variants": {
            n: {
                "ms_per_step": round(1e3 * sorted(ts)[len(ts) // 2], 1),
                "tokens_per_s": round(tokens / sum(ts), 1),
            }
            for n, ts in times.items()
        },
    }
    if forwards:
        timed = forwards[2:]
        result["target_forward"] = {
            "ms_per_batch": round(1e3 * sorted(timed)[len(timed) // 2], 1),
            "tokens_per_s": round(tokens / sum(timed), 1),
        }
    write(args.results, result, markdown(result))


if __name__ == "__main__":
    main()
