"""Sequence packing (``data.pack``) against right-padded rows: training tokens/s, and what a fit learns.

    .venv/bin/python benchmarks/packing.py [--rows 384] [--blocks 6] [--block-steps 4] [--fit-steps 60] [--seeds 0 1]

1. Throughput, SmolLM2-135M and the shipped ``smollm2/eagle3`` drafter (one layer, TTT 3, 4,096-token draft
   vocabulary) on the packed corpus (``benchmarks/data/smollm2-1m.tar.xz``, its first ``--rows`` rows), features
   read from a cache (``scaling.make_features``: ``feature_cache.eagle3_features``, EAGLE-3's layers, rows of 640
   tokens as ``scaling.py`` trains).
   Padded: the recipe's 8 rows a step, length-bucketed, one document a row. Packed: ``--tokens-per-batch`` (8 x 640
   by default: 8 rows of 640) filled by first-fit decreasing. Blocks of ``--block-steps`` padded steps and as many
   packed steps alternate (load falls on both alike); a step is the module's loss, backward, clipping and AdamW on
   a loaded batch (loading is timed apart). Tokens counted are real ones (``attention_mask``; not padding) and the
   generated ones the loss counts (``loss_mask``).
2. What is learned, on the toy ``default`` target and the shipped ``eagle3`` recipe through ``fit``: the padded fit
   of ``--fit-steps`` steps and the packed fit of as many real tokens (its steps = the padded fit's real tokens over
   a packed step's), ``--seeds`` each (the data seed: order and packing; the recipe seeds the weights with 0); the final ``val/tau_est`` (one document a row) of each.

Writes ``benchmarks/results/<--results>.{json,md}`` (``packing_<cpu>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from common import machine, measured_on, write
from fit_loop import machine_tag

BATCH, MAX_LENGTH = 8, 640


def loaders(train: Path, val: Path, features: Path, rows: int, tokens_per_batch: int, workers: int):
    from draftsmith.train.data import GeneratedDataModule

    common = {"batch_size": BATCH, "max_length": MAX_LENGTH, "features": str(features), "train_rows": rows}
    padded = GeneratedDataModule(str(train), str(val), num_workers=workers, **common)
    packed = GeneratedDataModule(
        str(train), str(val), pack=True, tokens_per_batch=tokens_per_batch, num_workers=workers, **common
    )
    for dm in (padded, packed):
        dm.setup()
    return padded, packed


def cycle(loader):
    while True:
        yield from loader


def throughput(args) -> dict:
    import yaml
    from scaling import DTYPE, PACKED, make_features

    from draftsmith.data.packed import unpack
    from draftsmith.families.eagle.module import EagleModule
    from draftsmith.layers.module import OptimConfig
    from draftsmith.targets import resolve

    train = unpack(PACKED, args.work / "data" / "train")
    features = make_features(train, args.rows)
    recipe = yaml.safe_load((Path(__file__).parents[1] / "configs/smollm2/eagle3.yaml").read_text())
    init = {k: v for k, v in recipe["model"]["init_args"].items() if k not in ("target", "optim", "estimate")}
    torch.manual_seed(0)
    module = EagleModule(f"{resolve('smollm2')}:{DTYPE}", **init, optim=OptimConfig(lr=2e-3))
    padded, packed = loaders(train, train, features, args.rows, args.tokens_per_batch, args.workers)
    module.target.check_final_logits("data.features")
    module.prepare_from_data(padded)
    module.train()
    params = module.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=1e-4)
    its = {"padded": cycle(padded.train_dataloader()), "packed": cycle(packed.train_dataloader())}
    stats = {k: {"s": [], "load_s": [], "real": [], "loss_tokens": [], "shape": []} for k in its}
    load = [round(os.getloadavg()[0], 2)]
    for block in range(args.blocks + 1):  # block 0: warm-up, not recorded
        for kind in ("padded", "packed") if block % 2 == 0 else ("packed", "padded"):
            for _ in range(args.block_steps):
                start = time.perf_counter()
                batch = next(its[kind])
                loaded = time.perf_counter()
                losses = module.losses(batch, module.target_forward(batch, module.loss_vocab()))
                losses["loss"].backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                end = time.perf_counter()
                if block:
                    s = stats[kind]
                    s["s"].append(end - loaded)
                    s["load_s"].append(loaded - start)
                    s["real"].append(int(batch["attention_mask"].sum()))
                    s["loss_tokens"].append(int(batch["loss_mask"].sum()))
                    s["shape"].append(list(batch["input_ids"].shape))
        load.append(round(os.getloadavg()[0], 2))
    out = {}
    for kind, s in stats.items():
        cells = sum(a * b for a, b in s["shape"])
        out[kind] = {
            "steps": len(s["s"]),
            "step_ms_median": round(1e3 * statistics.median(s["s"]), 1),
            "load_ms_median": round(1e3 * statistics.median(s["load_s"]), 2),
            "real_tokens_per_step": round(statistics.mean(s["real"]), 1),
            "loss_tokens_per_step": round(statistics.mean(s["loss_tokens"]), 1),
            "fill": round(sum(s["real"]) / cells, 3),
            "real_tokens_per_s": round(sum(s["real"]) / sum(s["s"]), 1),
            "loss_tokens_per_s": round(sum(s["loss_tokens"]) / sum(s["s"]), 1),
            "real_tokens_per_s_with_loading": round(sum(s["real"]) / (sum(s["s"]) + sum(s["load_s"])), 1),
        }
    ratio = out["packed"]["real_tokens_per_s"] / out["padded"]["real_tokens_per_s"]
    return {
        "target": f"smollm2:{DTYPE}",
        "recipe": "smollm2/eagle3",
        "rows": args.rows,
        "tokens_per_batch": args.tokens_per_batch,
        "workers": args.workers,
        "blocks": args.blocks,
        "block_steps": args.block_steps,
        "load": load,
        "kinds": out,
        "packed_over_padded_tokens_per_s": round(ratio, 3),
    }


def learned(args) -> dict:
    from fit_loop import data as toy_data

    from draftsmith.train.data import GeneratedDataModule
    from draftsmith.train.fit import FitRun, fit

    target, train, val = toy_data(args.work / "toy", args.prompts, args.new_tokens)
    length = args.pack_length
    per, longest = {}, 0
    for pack in (False, True):  # real tokens of a padded step (8 rows) and of one packed row of ``length``
        dm = GeneratedDataModule(
            str(train), str(val), batch_size=8, max_length=length if pack else 512, pack=pack,
            tokens_per_batch=length if pack else None,
        )  # fmt: skip
        dm.setup()
        longest = max(len(x) for x in dm.train_ds["input_ids"])
        batches = list(dm.train_dataloader())
        per[pack] = sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)
    rows = max(1, round(per[False] / per[True]))  # packed rows a step: about the padded step's real tokens
    packed_steps = max(1, round(args.fit_steps * per[False] / (rows * per[True])))
    packed_data = {"pack": True, "max_length": length, "tokens_per_batch": rows * length}
    fits = []
    for seed in args.seeds:
        for pack, steps in ((False, args.fit_steps), (True, packed_steps)):
            run = FitRun(
                target=str(target), train=str(train), val=str(val), out=args.work / f"fit-{'packed' if pack else 'padded'}-{seed}",
                steps=steps, data={**(packed_data if pack else {}), "seed": seed}, trainer={"val_check_interval": steps},
            )  # fmt: skip
            started = time.perf_counter()
            result = fit("eagle3", run)
            fits.append(
                {"pack": pack, "seed": seed, "steps": steps, "tau_est": round(result.score, 4),
                 "seconds": round(time.perf_counter() - started, 1)}
            )  # fmt: skip
            print(fits[-1], flush=True)
    taus = {p: [f["tau_est"] for f in fits if f["pack"] == p] for p in (False, True)}
    return {
        "target": "default (toy)",
        "recipe": "eagle3",
        "padded_steps": args.fit_steps,
        "packed_steps": packed_steps,
        "pack_length": length,
        "longest_document": longest,
        "packed_rows": rows,
        "real_tokens_per_step": {"padded": round(per[False], 1), "packed": round(rows * per[True], 1)},
        "fits": fits,
        "tau_est": {
            "padded": {"mean": round(statistics.mean(taus[False]), 4), "spread": round(max(taus[False]) - min(taus[False]), 4)},
            "packed": {"mean": round(statistics.mean(taus[True]), 4), "spread": round(max(taus[True]) - min(taus[True]), 4)},
        },
    }  # fmt: skip


def markdown(r: dict) -> str:
    lines = ["# Sequence packing against right-padded rows", "", f"{measured_on(r['machine'])}.", ""]
    if "throughput" in r:
        t = r["throughput"]
        lines += [
            f"## Training tokens/s: {t['target']}, `{t['recipe']}`, cached features, first {t['rows']} rows of the "
            "packed corpus",
            "",
            f"Padded: {BATCH} rows a step, length-bucketed; packed: {t['tokens_per_batch']} tokens a step in rows of "
            f"{MAX_LENGTH} (first-fit decreasing). {t['blocks']} blocks of {t['block_steps']} steps of each, "
            f"alternating, after one warm-up block; DataLoader workers {t['workers']}; load average {t['load']}.",
            "",
            "| batches | steps | ms / step (median) | real tokens / step | fill | **real tokens / s** | loss tokens / s | "
            "real tokens / s with loading |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for kind, k in t["kinds"].items():
            lines.append(
                f"| {kind} | {k['steps']} | {k['step_ms_median']} | {k['real_tokens_per_step']} | {k['fill']} | "
                f"**{k['real_tokens_per_s']}** | {k['loss_tokens_per_s']} | {k['real_tokens_per_s_with_loading']} |"
            )
        lines += ["", f"Packed / padded real tokens / s: **{t['packed_over_padded_tokens_per_s']:.3f}×**.", ""]
    if "learned" in r:
        le = r["learned"]
        lines += [
            f"## What is learned: {le['target']}, `{le['recipe']}` through `fit`, equal real tokens",
            "",
            f"Padded: {le['padded_steps']} steps of 8 rows, {le['real_tokens_per_step']['padded']} real tokens a step; "
            f"packed: {le['packed_steps']} steps of {le['packed_rows']} rows of {le['pack_length']} tokens (documents cut "
            f"there, the longest being {le['longest_document']}: a caveat, the padded fit reads them whole), {le['real_tokens_per_step']['packed']} real tokens a step: "
            "about the same tokens a step, so the same steps and schedule. Final `val/tau_est` (validation one document "
            "a row). Seeds are the data module's (order and packing); the recipe seeds the weights with 0.",
            "",
            "| batches | seed | steps | val τ_est | seconds |",
            "|---|---|---|---|---|",
        ]
        for f in le["fits"]:
            kind = "packed" if f["pack"] else "padded"
            lines.append(f"| {kind} | {f['seed']} | {f['steps']} | {f['tau_est']} | {f['seconds']} |")
        tau = le["tau_est"]
        lines += [
            "",
            f"Mean τ_est padded {tau['padded']['mean']} (spread {tau['padded']['spread']}), packed "
            f"{tau['packed']['mean']} (spread {tau['packed']['spread']}).",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["throughput", "learned"], choices=["throughput", "learned"])
    parser.add_argument("--rows", type=int, default=384, help="corpus rows the throughput part reads (and caches)")
    parser.add_argument("--tokens-per-batch", type=int, default=BATCH * MAX_LENGTH)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block-steps", type=int, default=4)
    parser.add_argument("--fit-steps", type=int, default=60, help="the padded toy fit's steps")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--pack-length", type=int, default=128, help="the packed toy fit's row length (max_length)")
    parser.add_argument("--prompts", type=int, default=400, help="training prompts the toy target continues")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/bench-packing"))
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    args.results = args.results or f"packing_{machine_tag()}"
    torch.set_num_threads(args.threads)
    from common import RESULTS

    earlier = RESULTS / f"{args.results}.json"  # the parts not run now are kept
    r = json.loads(earlier.read_text()) if earlier.is_file() else {}
    r |= {"machine": machine()}
    r.setdefault("commands", {})
    for part in args.parts:
        r["commands"][part] = "python benchmarks/packing.py " + " ".join(os.sys.argv[1:])
    if "throughput" in args.parts:
        r["throughput"] = throughput(args)
        print(r["throughput"], flush=True)
    if "learned" in args.parts:
        r["learned"] = learned(args)
    write(args.results, r, markdown(r))


if __name__ == "__main__":
    main()
