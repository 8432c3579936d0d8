"""The ``draftsmith generate`` stage per engine: ``--engine hf`` and ``--engine vllm`` (vLLM in its own venv) on the
same prompts and settings, each at the batch sizes it does best with.

Run: ``.venv/bin/python benchmarks/generate.py --engines hf vllm [--target-name default|smollm2] [--dtype bfloat16]``.
``--hf-batch-sizes`` and ``--vllm-batch-sizes`` (vLLM's ``max_num_seqs``) set each engine's batches; the rows run one
after the other in one run (an engine cannot be interleaved with another's process). Generation tokens/s counts the
shards' decoding; wall time adds loading (vLLM's engine start included). Writes ``generate_engines[_<target>].*``.
(Its former default mode, the decoding loop against HF ``model.generate``, is retired: ``RETIRED.md``.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from common import machine, write

from draftsmith.data.generate import generate, load_generated
from draftsmith.targets import resolve_target


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
    parser.add_argument("--engines", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--target-name", default="default", choices=["default", "smollm2"])
    parser.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--vllm-batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--vllm-python", default=None, help="the vLLM venv's python (default .venv-vllm/bin/python)")
    parser.add_argument("--dtype", default=None, help="the target's dtype (default: its auto)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass")
    engines(parser.parse_args())


if __name__ == "__main__":
    main()
