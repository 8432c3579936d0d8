"""Drafters trained at scale on SmolLM2-135M-Instruct (bf16 where the CPU has it), and how acceptance grows with the
data.

    python benchmarks/scaling.py [--out runs/scaling] [--stages data features fit score report]
        [--sizes 22000 100000 300000 1000000] [--families eagle3 eagle1 peagle medusa1 hydra hydrapp] [--magpie 3000]

Stages, each reused from ``--out`` when finished and resumed when interrupted (generation by its saved shards,
the feature cache by its shards, training from its last checkpoint, scoring by its saved blocks):

1. ``data``: the repository's packed corpus (``PACKED``; ``--corpus``) unpacked into ``--out``, so that every
   machine trains on the same tokens; or, with ``--corpus generate``, one drawn on this machine: the corpus prompts
   (``builtin:chat-train`` plus ``--magpie`` instructions SmolLM2 writes itself, shuffled), and SmolLM2's own
   answers to them in ``DTYPE``, sampled at T 0.7 / top-p 0.9 with a quarter of the prompts greedy, by the engine
   ``benchmarks/generate.py --engines`` measured fastest (vLLM, ``--engine``). Greedy validation data on held-out
   chat prompts (packed too, ``PACKED_VAL``, used where this run's dtype made it).
2. ``features``: the target's hidden states over the rows the fits read (the largest subset's; its disk use printed
   before it starts).
3. ``fit``: each family on nested subsets of the corpus (the first rows holding ``--sizes`` generated tokens; the
   corpus is in shuffled prompt order, so each subset is a random sample and contains the smaller ones), its draft
   vocabulary chosen from its own subset, ``--epochs`` passes (at least ``--min-steps`` steps); the heads (Medusa-1,
   Hydra, Hydra++) on the 300k subset only (``HEADS_AT``).
4. ``score``: every drafter on the same held-out sets (MT-bench, chat-heldout), greedy chains at K = 4, each row
   interleaved with plain decoding of the same target (batch-invariant).
5. ``report``: ``benchmarks/results/scaling.{json,md}`` and a plot (``scaling_float32`` on a CPU without native
   bf16; ``--results`` names another, e.g. for a run on another corpus); the fitted log-linear curve
   τ = a + b·ln(tokens); the papers' orderings (EAGLE-3 > EAGLE-1, Hydra++ > Hydra > Medusa-1) on the subsets of
   300k tokens or more (``benchmarks/scaling_report.py``).

``DTYPE``: bfloat16 where the CPU multiplies it natively (``core.machine.native_bf16``), else float32 (where bf16
is emulated and slower than float32): the target's dtype for the corpus, the features, scoring and the report's
labels. A corpus made in one dtype is reused only by runs in the same one (its settings record the dtype).

What each stage costs on 2 CPU cores (hours, per fit and per scored set): ``docs/results.md``, "Hours per
stage of ``benchmarks/scaling.py``".
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from common import decoding_modes, heldout_sets, machine

from draftsmith.core.files import write_whole
from draftsmith.core.machine import native_bf16
from draftsmith.data.chat_prompts import chat_prompts
from draftsmith.data.feature_cache import eagle3_features
from draftsmith.data.generate import load_generated
from draftsmith.data.magpie import write_instructions_generated
from draftsmith.data.packed import is_packed
from draftsmith.data.shards import snapshot
from draftsmith.data.stage import generated_once, unpacked_for
from draftsmith.errors import DraftsmithError
from draftsmith.eval.blocks import score_block
from draftsmith.eval.rows import read_rows
from draftsmith.targets import load_target, resolve, resolve_target
from draftsmith.train.data import generated_prefix
from draftsmith.train.fit import FitRun, load_recipe
from draftsmith.train.recorded import recorded_fit

DTYPE = "bfloat16" if native_bf16()[0] else "float32"
TARGET = f"smollm2:{DTYPE}"
SAMPLED = {"temperature": 0.7, "top_p": 0.9, "greedy_share": 0.25}
PACKED = Path(__file__).parent / "data" / "smollm2-1m.tar.xz"
"""The 1M-token corpus every machine trains on (``draftsmith pack`` of a ``--corpus generate`` run's data): SmolLM2's
bf16 answers to the corpus prompts, sampled as ``SAMPLED`` says; its prompts inside."""
PACKED_VAL = Path(__file__).parent / "data" / "smollm2-val.tar.xz"
"""The greedy validation answers (``val/tau_est``) that go with it, used where this run's dtype made them."""
MAX_LENGTH = 640
"""Tokens per training row (prompt + answer) the cache keeps and training reads."""
BATCH = 8
RECIPES = {
    "eagle3": "smollm2/eagle3",
    "eagle1": "smollm2/eagle1",
    "peagle": "smollm2/peagle",
    "medusa1": "smollm2/medusa1",
    "hydra": "smollm2/hydra",
    "hydrapp": "smollm2/hydrapp",
    "eagle3_31": "smollm2/eagle3_31",
    "eagle3_lk": "smollm2/eagle3_lk",
    "dflash": "smollm2/dflash",
    "dspark": "smollm2/dspark",
    **{row: f"smollm2/study/{row}" for row in ("eagle3_31_lk", "eagle3_31_ttt7", "eagle3_31_nodecay")},
    **{row: f"smollm2/study/{row}" for row in ("eagle3_31_2l", "eagle3_31_16k")},
    **{
        row: f"smollm2/study/{row}"
        for row in (
            "eagle3_31_clip",
            "eagle3_31_cos0",
            "eagle3_31_warm1pct",
            "eagle3_31_lr1e3",
            "eagle3_31_b2",
            "eagle3_31_headrand",
        )
    },
    **{row: f"smollm2/peers/{row}" for row in ("eagle3_speculators", "eagle3_specforge")},
    "eagle3_31_e4": "smollm2/eagle3_31",
    "eagle3_31_e8": "smollm2/eagle3_31",
}
"""The families: EAGLE-3, EAGLE-1 and P-EAGLE (started from the EAGLE-3 of the same subset) on every subset; the
heads (Medusa-1, Hydra, Hydra++) on the ``HEADS_AT`` subset; the recipe study's rows (EAGLE-3.1's norms, the LK
loss, DFlash, DSpark, and the rows over EAGLE-3.1 in ``configs/smollm2/study/``, each that recipe with one change:
``STUDY``) on the largest subset asked for only (``--sizes``; the default's 1M), and only when ``--families`` names
them."""
EPOCHS = {"eagle3_31_e4": 4.0, "eagle3_31_e8": 8.0}
"""Study rows that are another row's recipe trained for more passes than ``--epochs`` (DeepSpec: τ peaked near 4.6
epochs of a fixed set)."""
STUDY = (
    "eagle3_31",
    "eagle3_lk",
    "dflash",
    "dspark",
    "eagle3_speculators",
    "eagle3_specforge",
    *(f for f in RECIPES if f.startswith("eagle3_31_")),
)
"""Families trained on the largest subset only (issue 51's recipe study on the packed corpus: 1M, or a cheaper
ablation at ``--sizes 250000``), not by default."""
HEADS = ("medusa1", "hydra", "hydrapp")
HEADS_AT = 300_000
"""The one subset the heads are trained on: the papers' ordering Hydra++ > Hydra > Medusa-1 is asked for from 300k
tokens on (issue 30), and each of the 4 heads has its own 49k-token LM head (4 x 28M weights, over every position
of a batch), so a curve of them would cost more than the rest of the benchmark."""


def trained_at(family: str, size: int, sizes: list[int]) -> bool:
    """Whether ``family`` is fitted on the subset of ``size`` tokens in a run of ``sizes``."""
    if family in STUDY:
        return size == max(sizes)
    return family not in HEADS or size == HEADS_AT


def untrained(families: list[str], sizes: list[int]) -> list[str]:
    """The ``families`` that no subset of ``sizes`` trains (the heads without ``HEADS_AT``): refused up front."""
    return [f for f in families if not any(trained_at(f, size, sizes) for size in sizes)]


def results_name(target: str = TARGET) -> str:
    """``scaling`` for the bf16 target the issue asks about; ``scaling_float32`` where the CPU has no native bf16
    (its speedups are float32's, whose wide forward costs more: benchmarks/results/bf16_target.md)."""
    dtype = target.rsplit(":", 1)[-1]
    return "scaling" if dtype == "bfloat16" else f"scaling_{dtype}"


def corpus_prompts(out: Path, magpie: int, engine: dict) -> Path:
    """``builtin:chat-train`` plus ``magpie`` self-written instructions, shuffled (seed 0): ``prompts/corpus.jsonl``."""
    path = out / "prompts" / "corpus.jsonl"
    if path.is_file():
        return path
    instructions = out / "prompts" / "magpie.jsonl"
    if not instructions.is_file():
        print(f"data: {magpie} instructions SmolLM2 writes itself (Magpie)")
        n = write_instructions_generated(
            resolve_target(TARGET), magpie, instructions, out / "prompts" / "magpie", seed=1, **engine
        )
        print(f"data: {n} distinct instructions in {instructions}")
    rows = [{"messages": list(p.messages), "source": p.source} for p in chat_prompts("train")]
    rows += [json.loads(line) for line in instructions.read_text().splitlines()]
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"data: {len(rows)} corpus prompts in {path}")
    return path


def packed_data(out: Path, corpus: Path, val_prompts: int) -> tuple[Path, Path]:
    """The packed corpus unpacked into ``out/data/train`` (refused in one line where a generated corpus is there:
    subsets, caches and fits of two corpora never mix; a CPU without native bf16 trains on the bf16 corpus as it is,
    its target in float32), and the packed validation data when it was made as this run's would be."""
    try:
        train = unpacked_for(corpus, out / "data" / "train", DTYPE)
    except DraftsmithError as e:
        raise SystemExit(f"scaling: {e}") from None
    return train, make_val(out, val_prompts, PACKED_VAL)


def make_data(out: Path, magpie: int, engine: dict, max_new_tokens: int, val_prompts: int) -> tuple[Path, Path]:
    meta = out / "data" / "train" / "draftsmith.json"
    if meta.is_file() and "packed" in json.loads(meta.read_text()):
        raise SystemExit(f"scaling: {out}/data/train holds the packed corpus; generate a corpus into another --out")
    prompts = corpus_prompts(out, magpie, engine)
    train = generated_once(
        resolve_target(TARGET, quiet=True),
        out / "data" / "train",
        {"prompts": str(prompts), **SAMPLED, "max_new_tokens": max_new_tokens, "dtype": DTYPE, **engine},
    )
    return train, make_val(out, val_prompts)


def make_val(out: Path, val_prompts: int, packed: Path | None = None) -> Path:
    """Greedy answers to held-out chat prompts (``val/tau_est``); ``packed``: unpacked instead where it was made so."""
    settings = {"prompts": "builtin:chat-heldout", "temperature": 0.0, "num_prompts": val_prompts}
    settings |= {"max_new_tokens": 128, "dtype": DTYPE}
    return generated_once(resolve_target(TARGET, quiet=True), out / "data" / "val", settings, packed=packed)


def make_features(train: Path, rows: int | None = None) -> Path:
    """The target's hidden states over the corpus's first ``rows`` rows (None: all; the fits read no others; a
    cache of more rows is kept, one of fewer grown), in rows of ``MAX_LENGTH``, computed in ``DTYPE`` (the packed
    corpus was made in bfloat16; where bf16 is emulated the target runs in float32, as the fits and the scoring do,
    and ~7x faster than in emulated bf16)."""
    return eagle3_features(resolve_target(f"{resolve('smollm2')}:{DTYPE}"), train, MAX_LENGTH, rows)


def subset_rows(train: Path, sizes: list[int]) -> dict[int, tuple[int, int]]:
    """Per size: (rows, generated tokens) of the shortest prefix of the corpus holding that many generated tokens
    (the whole corpus when it holds fewer)."""
    ds, _ = load_generated(train)
    masks = ds["loss_mask"]
    return {size: generated_prefix(masks, size) for size in sizes}


def label(size: int) -> str:
    return f"{size // 1000}k" if size < 1_000_000 else f"{size / 1e6:g}M"


def fit_one(
    out: Path,
    family: str,
    size: int,
    subset: tuple[int, int],
    data,
    features: Path | None,
    epochs: float,
    min_steps: int,
):
    """Train ``family`` on the subset ``subset_rows`` gave (its first rows, their generated tokens): ``epochs`` passes
    over them (a study row of ``EPOCHS``: its own), at least ``min_steps`` steps of its recipe's batch, P-EAGLE from
    the EAGLE-3 of the same subset; resumed from its last checkpoint when interrupted (``recorded_fit``). Returns its
    export dir and a record of the fit (steps, seconds, generated tokens trained per second, the process's peak RSS,
    load)."""
    rows, generated = subset
    name = f"{family}-{label(size)}"
    batch = load_recipe(RECIPES[family])["data"].get("batch_size", BATCH)  # 8 rows but in the peers' controls
    steps = max(min_steps, math.ceil(EPOCHS.get(family, epochs) * rows / batch))
    bf16, _ = native_bf16()
    run = FitRun(
        target=TARGET,
        train=str(data[0]),
        val=str(data[1]),
        features=str(features) if features else None,
        out=out / "fit" / name,
        steps=steps,
        batch_size=batch,
        data={"train_rows": rows, "max_length": MAX_LENGTH},
        model={"init": str(out / "drafters" / f"eagle3-{label(size)}")} if family == "peagle" else {},
        trainer={
            "precision": "bf16-mixed" if bf16 else "32-true",
            "val_check_interval": min(200, max(1, steps // 4)),
            "enable_model_summary": False,
        },
        resume=True,
    )
    return recorded_fit(RECIPES[family], run, resolve_target(TARGET), out / "drafters" / name, generated)


MODES = decoding_modes()
"""Scoring modes: greedy chains at K = 4 (every subset), and for the largest subset ``--k auto`` and sampling at
T 0.7 / top-p 0.9 (K = 4)."""


def block_names(asked: list[str], held: list[str]) -> list[str]:
    """The drafters a block is scored with: those a saved block of the same set, mode and subset holds (``held``,
    those still on disk), then those asked. A block is scored again whole, so asking for new drafters never drops
    the others from it (scoring the heads alone at 300k keeps EAGLE-3, EAGLE-1 and P-EAGLE in the 300k block). The
    n-gram reference last."""
    return sorted(held + [n for n in asked if n not in held], key=lambda n: n == "ngram")


def score_size(
    out: Path, size: int, families: list[str], sets: dict, max_new: int, modes: list[str], ngram: bool, run: bool
) -> dict:
    """Every family of one subset per held-out set and mode, one interleaved run with plain decoding each (with the
    n-gram drafter as the training-free reference when ``ngram``); each block saved once scored, stamped with the
    git SHA and date that scored it (``scored``), and reused when it holds every drafter asked (a block scored when
    this subset was the largest also holds the n-gram reference), else scored again with the drafters it held and
    those asked (``block_names``). ``run`` False: only the blocks already scored (``--stages report``)."""
    target, blocks = None, {}
    names = [f"{f}-{label(size)}" for f in families] + (["ngram"] if ngram else [])
    for mode in modes:
        k, sampling = MODES[mode]
        for set_name, (prompts, categories) in sets.items():
            path = out / "score" / f"{set_name}-{mode}-{label(size)}.json"
            key = f"{set_name} {mode}"
            saved = json.loads(path.read_text()) if path.is_file() else None
            held = [d.name for d in read_rows(saved["drafters"])] if saved else []
            if saved and set(names) <= set(held):
                blocks[key] = saved
                continue
            if not run:
                continue
            target = target or load_target(resolve_target(TARGET))
            exists = [n for n in held if n == "ngram" or (out / "drafters" / n / "config.json").is_file()]
            drafters = {n: n if n == "ngram" else str(out / "drafters" / n) for n in block_names(names, exists)}
            block, stamp = score_block(target, drafters, prompts, k, sampling, max_new, categories), machine()
            blocks[key] = block | {"scored": f"{stamp['git']} {stamp['date']}"}
            write_whole(path, json.dumps(blocks[key], indent=2))
    return blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scaling"))
    parser.add_argument("--stages", nargs="+", default=["data", "features", "fit", "score", "report"])
    parser.add_argument(
        "--corpus",
        default=str(PACKED) if PACKED.is_file() else "generate",
        help="a packed corpus to train on (default: the repository's), or `generate` to draw one on this machine",
    )
    parser.add_argument("--magpie", type=int, default=3000, help="self-written instructions added to chat-train")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="answer length cap of the corpus")
    parser.add_argument("--val-prompts", type=int, default=64)
    parser.add_argument("--engine", default="vllm", choices=["hf", "vllm"])
    parser.add_argument("--batch-size", type=int, default=256, help="generation batch (vLLM: max_num_seqs)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[22_000, 100_000, 300_000, 1_000_000])
    parser.add_argument("--families", nargs="+", default=[f for f in RECIPES if f not in STUDY], choices=list(RECIPES))
    parser.add_argument("--epochs", type=float, default=2.0, help="passes over each subset")
    parser.add_argument("--min-steps", type=int, default=100, help="optimizer steps at least (small subsets)")
    parser.add_argument("--num-prompts", type=int, default=32, help="held-out prompts per scored set")
    parser.add_argument("--score-tokens", type=int, default=128, help="new tokens per scored prompt")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        choices=list(MODES),
        help="scoring modes (auto, sampled: largest subset)",
    )
    parser.add_argument(
        "--online", action="store_true", help="no feature cache: the target runs in every training step (a few fits)"
    )
    parser.add_argument(
        "--results",
        default=results_name(),
        help="the report's name in benchmarks/results (another corpus than the committed report's: another name)",
    )
    parser.add_argument(
        "--snapshot",
        type=Path,
        help="train on this corpus run's finished shards while it goes on, all of it once done (into another --out)",
    )
    args = parser.parse_args()
    if args.corpus != "generate" and not (is_packed(args.corpus) and Path(args.corpus).is_file()):
        parser.error(f"--corpus {args.corpus}: no packed corpus file (a .tar.xz of `draftsmith pack`) nor `generate`")
    if none := untrained(args.families, args.sizes):
        parser.error(f"--families {' '.join(none)}: trained at {HEADS_AT:,} tokens only, not one of --sizes")
    engine = {"engine": args.engine, "batch_size": args.batch_size}
    if args.snapshot:  # the corpus's finished shards so far (its first rows), while its generation goes on
        if args.snapshot.resolve() == (args.out / "data" / "train").resolve():
            raise SystemExit("scaling: --snapshot needs another --out than the corpus run's")
        data = (snapshot(args.snapshot, args.out / "data" / "train"), make_val(args.out, args.val_prompts))
        print(f"snapshot: {load_generated(data[0])[1]['snapshot']}")
    elif args.corpus != "generate":
        data = packed_data(args.out, Path(args.corpus), args.val_prompts)
    else:
        data = make_data(args.out, args.magpie, engine, args.max_new_tokens, args.val_prompts)  # reused once made
    if args.stages == ["data"]:
        return
    subsets = subset_rows(data[0], args.sizes)
    # only the rows the largest subset's fits read (the 250k subset: a fifth of the 1M corpus's cache)
    features = None if args.online else make_features(data[0], max(rows for rows, _ in subsets.values()))
    for size, (rows, tokens) in subsets.items():
        print(f"subset {label(size)}: the first {rows} rows, {tokens:,} generated tokens")
    fits = {}
    for size, subset in subsets.items():
        # P-EAGLE after the EAGLE-3 it starts from
        for family in [f for f in args.families if trained_at(f, size, args.sizes)]:
            record = args.out / "fit" / f"{family}-{label(size)}.json"
            if "fit" in args.stages:
                fits[family, size] = fit_one(
                    args.out, family, size, subset, data, features, args.epochs, args.min_steps
                )
            elif record.is_file():
                fits[family, size] = (args.out / "drafters" / f"{family}-{label(size)}", json.loads(record.read_text()))
    if "score" not in args.stages and "report" not in args.stages:
        return
    tokenizer = load_target(resolve_target(TARGET)).tokenizer
    sets = heldout_sets(tokenizer, args.num_prompts)
    scores = {}
    for size in subsets:
        done = [f for f in args.families if (args.out / "drafters" / f"{f}-{label(size)}" / "config.json").is_file()]
        modes = [m for m in args.modes if m == "greedy" or size == max(subsets)]
        if done:
            # the n-gram reference does not depend on the data: scored once, beside the largest subset
            run = "score" in args.stages
            scores[size] = score_size(args.out, size, done, sets, args.score_tokens, modes, size == max(subsets), run)
    if "report" in args.stages:
        from scaling_report import report  # it imports this module's study

        report(args, data, subsets, fits, scores)


if __name__ == "__main__":
    main()
