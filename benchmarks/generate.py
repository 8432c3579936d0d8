"""Tokens/s of ``draftsmith generate``'s decoding loop against ``model.generate`` of the same target.

Run: ``.venv/bin/python benchmarks/generate.py [--target DIR] [--num-prompts 64] [--max-new-tokens 64]``.
Both decode the same prompts in the same length-sorted batches (left padded), sampling at
temperature 1, interleaved batch by batch in one run. Two modes: ``fixed length`` ignores
EOS so both do exactly the same work (the headline ratio); ``stop at EOS`` is the realistic
one, where the two draw different samples and so different lengths. The end-to-end
``generate()`` stage (prompt encoding, shard writing, final dataset) is timed as well.

``--engines hf vllm [--target-name default|smollm2]`` compares the engines instead: the whole ``draftsmith generate``
stage with ``--engine hf`` and ``--engine vllm`` (vLLM in its own venv) on the same prompts and settings, each at
the batch sizes it does best with (``--hf-batch-sizes``, ``--vllm-batch-sizes``: vLLM's ``max_num_seqs``), one
after the other in one run (an engine cannot be interleaved with another's process). Generation tokens/s counts the
shards' decoding; wall time adds loading (vLLM's engine start included). Writes ``generate_engines[_<target>].*``.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path

import torch
from common import machine, prompt_ids, write

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.decode import decode_batch, row_seed
from draftsmith.data.generate import generate, load_generated
from draftsmith.targets import default as default_target
from draftsmith.targets import resolve_target


def batches(prompts: list[list[int]], size: int) -> list[list[list[int]]]:
    """Longest first, as ``generate`` batches them."""
    order = sorted(prompts, key=len, reverse=True)
    return [order[i : i + size] for i in range(0, len(order), size)]


def count(tokens: list[int], max_new_tokens: int, eos: int | None) -> int:
    return tokens.index(eos) + 1 if eos is not None and eos in tokens else min(len(tokens), max_new_tokens)


def run_hf(model, batch: list[list[int]], config, pad: int, eos: int | None) -> int:
    width = max(map(len, batch))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config)
    return sum(count(row, config.max_new_tokens, eos) for row in out[:, width:].tolist())


def run_ours(model, batch: list[list[int]], offset: int, max_new_tokens: int, eos: int | None, context: int) -> int:
    seeds = [row_seed(0, offset + i, 0) for i in range(len(batch))]
    return sum(len(d.tokens) for d in decode_batch(model, batch, seeds, Sampling(1.0), max_new_tokens, eos, context))


def compare(target: Target, prompts: list[list[int]], batch_size: int, max_new_tokens: int, stop_at_eos: bool) -> dict:
    model, eos = target.model, target.eos_token_id if stop_at_eos else None
    context = target.config.max_position_embeddings
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    saved_eos = model.generation_config.eos_token_id
    # generate falls back to the model's generation_config for an unset EOS: unset it there too
    model.generation_config.eos_token_id = eos
    try:
        config = copy.deepcopy(model.generation_config)
        config.update(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)
        config.pad_token_id = pad
        return _compare(model, batches(prompts, batch_size), config, pad, eos, context, batch_size, max_new_tokens)
    finally:
        model.generation_config.eos_token_id = saved_eos


def _compare(model, groups, config, pad: int, eos: int | None, context: int, batch_size: int, max_new_tokens: int):
    torch.manual_seed(0)
    warm = copy.deepcopy(config)
    warm.max_new_tokens = 8
    run_ours(model, groups[0], 0, 8, eos, context)  # warm-up: first calls pay one-off allocation costs
    run_hf(model, groups[0], warm, pad, eos)
    tokens = {"draftsmith": 0, "model.generate": 0}
    seconds = {"draftsmith": 0.0, "model.generate": 0.0}
    for i, batch in enumerate(groups):
        jobs = [
            ("draftsmith", lambda b=batch, i=i: run_ours(model, b, i * batch_size, max_new_tokens, eos, context)),
            ("model.generate", lambda b=batch: run_hf(model, b, config, pad, eos)),
        ]
        for name, job in jobs if i % 2 == 0 else jobs[::-1]:  # alternate who goes first
            start = time.perf_counter()
            tokens[name] += job()
            seconds[name] += time.perf_counter() - start
    rate = {k: tokens[k] / seconds[k] for k in tokens}
    return {
        "batch_size": batch_size,
        "mode": "stop at EOS" if eos is not None else "fixed length",
        "tokens": tokens,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "ratio": round(rate["draftsmith"] / rate["model.generate"], 3),
    }


def end_to_end(target_dir: Path, num_prompts: int, batch_size: int, max_new_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "data"
        start = time.perf_counter()
        generate(
            resolve_target(str(target_dir)),
            "builtin:train",
            out,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            num_prompts=num_prompts,
            shard_size=max(batch_size, num_prompts // 4),
            device="cpu",
        )
        wall = time.perf_counter() - start
        _, meta = load_generated(out)
    return {
        "batch_size": batch_size,
        "generated_tokens": meta["generated_tokens"],
        "generation_tokens_per_s": meta["tokens_per_s"],
        "wall_seconds": round(wall, 2),
        "wall_tokens_per_s": round(meta["generated_tokens"] / wall, 1),
    }


def engines(args: argparse.Namespace) -> None:
    """``--engines``: the generate stage per engine and batch size (see the module docstring)."""
    prompts = {"default": "builtin:train", "smollm2": "builtin:chat-train"}[args.target_name]
    load_before = os.getloadavg()[0]
    rows = []
    for engine in args.engines:
        for batch_size in args.hf_batch_sizes if engine == "hf" else args.vllm_batch_sizes:
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                generate(
                    resolve_target(args.target_name, args.dtype),
                    prompts,
                    Path(tmp) / "data",
                    max_new_tokens=args.max_new_tokens,
                    num_prompts=args.num_prompts,
                    batch_size=batch_size,
                    shard_size=args.num_prompts,
                    device="cpu",
                    engine=engine,
                    vllm_python=args.vllm_python,
                    temperature=args.temperature,
                    top_p=args.top_p,
                )
                wall = time.perf_counter() - start
                _, meta = load_generated(Path(tmp) / "data")
            rows.append(
                {
                    "engine": f"{engine} {meta['engine']['version']}",
                    "batch_size": batch_size,
                    "dtype": meta["settings"]["dtype"],
                    "generated_tokens": meta["generated_tokens"],
                    "generation_tokens_per_s": meta["tokens_per_s"],
                    "wall_seconds": round(wall, 1),
                }
            )
            print(rows[-1])
    data = {"machine": machine(), "load": [load_before, os.getloadavg()[0]], "args": vars(args), "rows": rows}
    m = data["machine"]
    best = {e: max(r["generation_tokens_per_s"] for r in rows if r["engine"].startswith(e)) for e in args.engines}
    md = [
        f"# Generation engines: {args.target_name} target",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m['platform']}, {m['threads']} threads; load average "
        f"before / after {data['load'][0]:.2f} / {data['load'][1]:.2f}). {args.num_prompts} `{prompts}` prompts, "
        f"temperature {args.temperature}, top-p {args.top_p}, up to {args.max_new_tokens} new tokens (stop at EOS), "
        "the whole `draftsmith generate` stage per row, one row after the other.",
        "",
        "| engine | dtype | batch (vLLM: max_num_seqs) | generated tokens | generation tok/s | wall s (load included) |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['engine']} | {r.get('dtype', 'float32')} | {r['batch_size']} | {r['generated_tokens']} | {r['generation_tokens_per_s']:.0f} | "
            f"{r['wall_seconds']} |"
            for r in rows
        ],
        "",
        "Best generation tokens/s: "
        + ", ".join(f"{e} {v:.0f}" for e, v in best.items())
        + (f"; vLLM / HF = {best['vllm'] / best['hf']:.2f}×." if {"hf", "vllm"} <= set(best) else "."),
    ]
    suffix = ("" if args.target_name == "default" else f"_{args.target_name}") + (
        f"_{args.dtype}" if args.dtype else ""
    )
    write(f"generate_engines{suffix}", data, "\n".join(md) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path, default=None, help="model dir (default: the default target)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--name", default="generate", help="results file name")
    parser.add_argument("--engines", nargs="+", choices=["hf", "vllm"], help="compare the engines instead")
    parser.add_argument("--target-name", default="default", choices=["default", "smollm2"])
    parser.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--vllm-batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--vllm-python", default=None, help="the vLLM venv's python (default .venv-vllm/bin/python)")
    parser.add_argument("--dtype", default=None, help="--engines: the target's dtype (default: its auto)")
    parser.add_argument("--temperature", type=float, default=1.0, help="--engines: sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="--engines: nucleus mass")
    args = parser.parse_args()
    if args.engines:
        engines(args)
        return

    if args.threads:
        torch.set_num_threads(args.threads)
    target_dir = args.target or default_target.build()
    target = Target.from_pretrained(target_dir)
    prompts = prompt_ids("builtin:train", target.tokenizer, args.num_prompts)
    runs = [
        compare(target, prompts, b, args.max_new_tokens, stop_at_eos)
        for stop_at_eos in (False, True)
        for b in args.batch_sizes
    ]
    e2e = [end_to_end(target_dir, args.num_prompts, b, args.max_new_tokens) for b in args.batch_sizes]
    data = {
        "machine": machine(),
        "target": target.fingerprint,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": runs,
        "end_to_end": e2e,
    }
    rows = "\n".join(
        f"| {r['batch_size']} | {r['mode']} | {r['tokens']['draftsmith']} | {r['tokens_per_s']['draftsmith']:.0f} "
        f"| {r['tokens']['model.generate']} | {r['tokens_per_s']['model.generate']:.0f} | {r['ratio']:.2f} |"
        for r in runs
    )
    e2e_rows = "\n".join(
        f"| {r['batch_size']} | {r['generated_tokens']} | {r['generation_tokens_per_s']:.0f} "
        f"| {r['wall_seconds']} | {r['wall_tokens_per_s']:.0f} |"
        for r in e2e
    )
    m = data["machine"]
    md = (
        f"# Generation benchmark\n\n{target_dir.name if args.target else 'Default target'}, "
        f"{len(prompts)} `builtin:train` prompts, temperature 1, {args.max_new_tokens} new tokens; "
        f"`{m['command']}` on {m['date']} ({m['platform']}, {m['threads']} threads, git {m['git']}).\n\n"
        "Decoding loop, same prompts and batches, interleaved (ratio = draftsmith / model.generate tokens/s):\n\n"
        "| batch | mode | draftsmith tokens | draftsmith tok/s | generate tokens | generate tok/s | ratio |\n"
        "|---|---|---|---|---|---|---|\n" + rows + "\n\n"
        "End to end (`draftsmith.data.generate.generate`, stop at EOS, shards + final dataset written):\n\n"
        "| batch | tokens | generation tok/s | wall s | wall tok/s |\n|---|---|---|---|---|\n" + e2e_rows + "\n"
    )
    write(args.name, data, md)


if __name__ == "__main__":
    main()
