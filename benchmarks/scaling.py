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
   300k tokens or more.

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

from common import RESULTS, decoding_modes, draft_vocab_coverage, heldout_sets, machine, write

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
from draftsmith.eval import plots
from draftsmith.eval.blocks import score_block
from draftsmith.eval.report import auto_k_table, markdown_table
from draftsmith.eval.rows import read_block, read_rows
from draftsmith.targets import load_target, resolve, resolve_target
from draftsmith.train.data import generated_prefix
from draftsmith.train.fit import FitRun, load_recipe
from draftsmith.train.learning_curve import least_squares, tokens_of
from draftsmith.train.recorded import fit_epochs, recorded_fit

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
GOAL_TAU = 2.2
"""Issue 30's goal for EAGLE-3 (chain, greedy, K = 4, MT-bench): each fitted curve says how much data would reach it."""
ORDERED_FROM = 300_000
"""The subsets the papers' orderings are checked on: this many tokens or more."""
ORDERINGS = [("eagle3", "eagle1"), ("hydrapp", "hydra"), ("hydra", "medusa1")]
"""The papers' orderings by τ (the first above the second), checked per set on the subsets of ``ORDERED_FROM``
tokens or more."""


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


def coverage(export: Path, val: Path) -> float | None:
    """Share of the held-out generated tokens (the validation data) inside the drafter's draft vocabulary (None: a
    drafter over the whole vocabulary)."""
    share = draft_vocab_coverage(export, val)
    return None if share is None else round(share, 4)


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


def fit_curve(points: list[tuple[float, float]]) -> dict | None:
    """Least squares τ = a + b·ln(tokens) (the Scylla paper's log-linear data scaling), with each doubling's gain."""
    if len(points) < 2:
        return None
    a, b = least_squares(points)
    per_doubling = [
        round((y2 - y1) / math.log2(x2 / x1), 4)
        for (x1, y1), (x2, y2) in zip(points, points[1:], strict=False)
        if x2 > x1
    ]
    # returns diminish where a doubling of the data, after the best one, first buys less than half of what it bought
    best = max(per_doubling, default=0.0)
    after = per_doubling.index(best) + 1 if per_doubling else 0
    where = next((points[i][0] for i, g in enumerate(per_doubling) if i >= after and best > 0 and g < 0.5 * best), None)
    last_x, last_y = points[-1]
    last = per_doubling[-1] if per_doubling else 0.0
    return {
        "a": round(a, 4),
        "b": round(b, 4),
        "gain_per_doubling": round(b * math.log(2), 4),
        "segments": per_doubling,
        "diminishing_from": where,
        # the tokens at which the fitted line reaches GOAL_TAU (None: it does not rise); an extrapolation
        "tokens_for_goal": round(math.exp((GOAL_TAU - a) / b)) if b > 0 else None,
        # ... and at which the last segment's gain per doubling, kept up from the last point, would reach it
        "tokens_for_goal_last": round(last_x * 2 ** ((GOAL_TAU - last_y) / last)) if last > 0 else None,
    }


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
        report(args, data, subsets, fits, scores)


def report(args, data, subsets: dict, fits: dict, scores: dict) -> None:
    rows = []
    for size, blocks in scores.items():
        for key, block in blocks.items():
            set_name, mode = key.split(" ")
            plain, scored = read_block(block)
            for d in scored if mode == "greedy" else []:
                if d.name == "ngram":
                    continue
                family = d.name.rsplit("-", 1)[0]
                fit = fits.get((family, size), (None, {}))[1]
                rows.append(
                    ({"run": block["scored"]} if "scored" in block else {})
                    | {
                        "set": set_name,
                        "family": family,
                        "size": size,
                        "rows": subsets[size][0],
                        "tokens": subsets[size][1],
                        "tau": d.tau,
                        "alpha": d.alpha,
                        "accept_at": d.accept_at,
                        "speedup": d.speedup,
                        "ideal": d.ideal_speedup,
                        "plain_tokens_per_s": plain.tokens_per_s,
                        "coverage": coverage(args.out / "drafters" / d.name, data[1]),
                        "fit_seconds": fit.get("seconds"),
                        "fit_sessions": fit.get("sessions", 1),
                        "steps": fit.get("steps"),
                        "epochs": fit_epochs(fit),
                        "val_tau_est": fit.get("val_tau_est"),
                    }
                )
    keep = ("rows", "generated_tokens", "prompt_tokens", "tokens_per_s", "seconds", "engine", "settings", "snapshot")
    keep += ("shards",)  # a finished corpus run's: its snapshot is then all of it
    corpus = {k: v for k, v in load_generated(data[0])[1].items() if k in keep}
    blocks = {f"{key} {label(size)}": b for size, blocks in scores.items() for key, b in blocks.items()}
    prior = earlier_run(subsets, args.results)
    if prior:  # the same corpus: the earlier run's rows and blocks this run has not scored, marked with their run
        scored = {(r["set"], r["family"], r["size"]) for r in rows}
        rows += [r for r in prior["rows"] if (r["set"], r["family"], r["size"]) not in scored]
        blocks |= {k: b for k, b in prior["blocks"].items() if k not in blocks}
        blocks = dict(sorted(blocks.items(), key=lambda kv: block_size(kv[0])))
        if prior["corpus"].get("generated_tokens", 0) > corpus.get("generated_tokens", 0):
            corpus = prior["corpus"] | {"regenerated": corpus}  # this run made its first rows again
    families = [f for f in RECIPES if any(r["family"] == f for r in rows)]
    curves = {
        f"{s}/{f}": fit_curve(sorted((r["tokens"], r["tau"]) for r in rows if r["set"] == s and r["family"] == f))
        for s in ("mt-bench", "chat-heldout")
        for f in families
    }
    result = {
        "machine": machine(),
        "target": TARGET,
        "corpus": corpus,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
        "curves": curves,
        "blocks": blocks,
    }
    result["orderings"] = orderings(rows)
    plot(rows, families, RESULTS / f"{args.results}.png")
    write(args.results, result, markdown(result))


def earlier_run(subsets: dict[int, tuple[int, int]], name: str | None = None) -> dict | None:
    """The committed results of an earlier run (``RESULTS/<name>.json``) when they were made on this
    corpus: each subset both runs recorded, and this corpus holds whole, has the same rows and generated tokens (a
    corpus made again from the same prompts is the same corpus: every row is sampled with its own seed). Its rows
    come back marked with the run that scored them (``run``: git SHA and date), so a benchmark of many hours can
    go on across machines that keep only what was committed. None when there is none or the corpora differ."""
    path = RESULTS / f"{name or results_name()}.json"
    if not path.is_file():
        return None
    prior = json.loads(path.read_text())
    recorded = {r["size"]: (r["rows"], r["tokens"]) for r in prior["rows"]}
    shared = [s for s in recorded if s in subsets and subsets[s][1] >= s]
    if not shared or any(recorded[s] != subsets[s] for s in shared):
        return None
    run = f"{prior['machine']['git']} {prior['machine']['date']}"
    prior["rows"] = [{"run": run} | r for r in prior["rows"]]  # a row carried over twice keeps its first run
    return prior


def block_size(title: str) -> int:
    """A block title's subset size (``mt-bench greedy 1M`` -> 1,000,000): the report lists blocks by size."""
    return tokens_of(title.rsplit(" ", 1)[-1])


def orderings(rows: list[dict]) -> list[dict]:
    """Per set and subset of ``ORDERED_FROM`` tokens or more: each of ``ORDERINGS`` whose two families were scored there,
    with their τ and whether the papers' order holds."""
    out = []
    for s, size in sorted({(r["set"], r["size"]) for r in rows if r["size"] >= ORDERED_FROM}):
        tau = {r["family"]: r["tau"] for r in rows if r["set"] == s and r["size"] == size}
        for hi, lo in ORDERINGS:
            if hi in tau and lo in tau:
                out.append(
                    {
                        "set": s,
                        "size": size,
                        "above": hi,
                        "below": lo,
                        "tau": [tau[hi], tau[lo]],
                        "holds": tau[hi] > tau[lo],
                    }
                )
    return out


def plot(rows: list[dict], families: list[str], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for s, ax in zip(("mt-bench", "chat-heldout"), axes, strict=True):
        for f in families:
            pts = sorted((r["tokens"], r["tau"]) for r in rows if r["set"] == s and r["family"] == f)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f)
        ax.set(xscale="log", title=f"τ at K = 4, {s}", xlabel="generated training tokens", ylabel="τ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    plots.save(fig, path)


def short_dtype(target: str) -> str:
    """``smollm2:bfloat16`` -> ``bf16`` (the report's label for the target's dtype)."""
    dtype = target.rsplit(":", 1)[-1]
    return {"bfloat16": "bf16", "float32": "float32"}.get(dtype, dtype)


def markdown(result: dict) -> str:
    m, c, dtype = result["machine"], result["corpus"], short_dtype(result["target"])
    carried = any("run" in r for r in result["rows"])  # rows of an earlier run: a column names each row's run
    lines = [
        f"# Data scaling: drafters for SmolLM2-135M-Instruct ({dtype})",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m.get('cpu', m['platform'])}"
        f"{', ' + ', '.join(m['cpu_flags']) if m.get('cpu_flags') else ''}; {m['threads']} threads). Corpus: "
        f"{c.get('rows')} answers, {c.get('generated_tokens'):,} generated tokens ({c.get('engine', {}).get('name')} in "
        f"{c.get('settings', {}).get('dtype')}, T {c.get('settings', {}).get('temperature')}, top-p "
        f"{c.get('settings', {}).get('top_p')}, greedy share {c.get('settings', {}).get('greedy_share')}, "
        f"{c.get('tokens_per_s')} tokens/s)"
        + (
            (
                f", the first {snap['shards']} finished shards of {snap['shard_size']} prompts of the corpus run "
                "while it went on (a prefix of the whole corpus)"
                if c.get("shards") != snap["shards"]
                else f", all {snap['shards']} shards of {snap['shard_size']} prompts (a fit made while it went on "
                "trained on its first finished shards: the same rows)"
            )
            if (snap := c.get("snapshot"))
            else ""
        )
        + (
            f". This run generated its first {again['rows']} answers again ({again['generated_tokens']:,} tokens, "
            f"{again['tokens_per_s']} tokens/s) and found each subset they hold the same rows and tokens as in the "
            "run that made the corpus; rows scored by an earlier run name it (scored by)"
            if (again := c.get("regenerated"))
            else ""
        )
        + ". Each subset is a prefix of the corpus (nested); epochs: each fit's passes over its subset (a fit made "
        "earlier is reused as it was made, whatever this run's --epochs). Scored: greedy chains at "
        f"K = 4, each row interleaved per prompt with plain decoding of the same {dtype} target (batch-invariant).",
        "",
        "| set | family | tokens | rows | steps | epochs | fit s | val τ_est | τ | α | per-position acceptance | speedup "
        "| ideal | draft-vocab coverage |" + " scored by |" * carried,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * carried,
    ]
    for r in sorted(result["rows"], key=lambda r: (r["set"], r["family"], r["tokens"])):
        acc = " ".join(f"{a:.2f}" for a in r["accept_at"])
        cov = f"{r['coverage']:.3f}" if r["coverage"] is not None else "–"
        lines.append(
            f"| {r['set']} | {r['family']} | {r['tokens']:,} | {r['rows']} | {r['steps']} | {r.get('epochs')} | "
            f"{r['fit_seconds']}{f' ({n} runs)' if (n := r.get('fit_sessions', 1)) > 1 else ''} | "
            f"{r['val_tau_est'] or 0:.2f} | {r['tau']:.2f} | {r['alpha']:.3f} | {acc} | {r['speedup']:.2f}× | "
            f"{(r['ideal'] or 0):.2f}× | {cov} |" + f" {r.get('run', 'this run')} |" * carried
        )
    lines += [
        "",
        "Log-linear fits τ = a + b·ln(tokens) and the measured gain in τ per doubling of the data, per segment:",
        "",
    ]
    for name, curve in result["curves"].items():
        if curve:
            lines.append(
                f"- {name}: a = {curve['a']}, b = {curve['b']} ({curve['gain_per_doubling']} τ per doubling); "
                f"segments: {', '.join(map(str, curve['segments']))}; "
                + (
                    f"returns diminish from {curve['diminishing_from']:,} tokens (a doubling there buys less than half "
                    "of the best doubling)"
                    if curve["diminishing_from"]
                    else "no diminishing returns within the measured range"
                )
                + (
                    f"; the line reaches τ {GOAL_TAU} at {goal:.3g} tokens (extrapolated)"
                    if (goal := curve.get("tokens_for_goal"))
                    else ""
                )
                + (f", the last segment's rate at {goal:.3g}" if (goal := curve.get("tokens_for_goal_last")) else "")
            )
    for title, block in result["blocks"].items():
        plain, rows = read_block(block)
        lines += ["", f"## {title}", "", markdown_table(rows, plain)]
        if auto_k_table(rows):
            lines += ["", auto_k_table(rows)]
    if result.get("orderings"):
        lines += ["", "The papers' orderings by τ (K = 4, greedy):", ""]
        lines += [
            f"- {o['set']}, {label(o['size'])}: {o['above']} τ {o['tau'][0]:.2f} vs {o['below']} τ {o['tau'][1]:.2f}: "
            + ("holds" if o["holds"] else "does not hold")
            for o in result["orderings"]
        ]
    name = result["args"].get("results") or results_name(result["target"])
    lines += ["", f"![scaling]({name}.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
