"""The peers side by side: draftsmith's EAGLE-3.1 and the EAGLE-3 drafters that vllm-project/speculators and SpecForge
train with their own code on the same packed corpus, scored by draftsmith's verifier in the same interleaved blocks.

    python benchmarks/peers.py --drafter draftsmith=runs/peers/study/drafters/eagle3_31-250k \\
        --drafter speculators=runs/peers/speculators-250k/imported --drafter specforge=runs/peers/specforge-250k/imported \\
        [--base draftsmith] [--out runs/peers/blocks] [--num-prompts 32] [--max-new-tokens 128] \\
        [--modes greedy auto sampled] [--sets mt-bench chat-heldout] [--results peers_smollm2]

Each ``--drafter NAME=DIR`` is a drafter dir ``draftsmith`` decodes: draftsmith's own export, or a peer's checkpoint
brought in with ``draftsmith import`` as a user would (no edits). Its fit record is the first of ``DIR/fit.json``,
``DIR/../fit.json`` and, for a ``benchmarks/scaling.py`` export (``STUDY/drafters/NAME``), ``STUDY/fit/NAME.json``:
the trainer's wall-clock, tokens/s, peak memory, steps and passes over the data (the peers' harnesses,
``engines/peers/*_train.py``, write theirs; ``scaling.fit_one`` draftsmith's).

One block per held-out set (MT-bench first turns, N / 8 per category; chat-heldout) and mode, every decoder
interleaved prompt by prompt in one run (``score_drafters``): plain decoding of the verified target, the same
weights with the fastest kernels and in float32 (the fastest plain decoding on a CPU with AMX is float32's), and
every drafter. Modes: ``greedy`` chains at K = 4, ``auto`` (``--k auto``: each drafter's fastest shape here), and
``sampled`` at T 0.7 / top-p 0.9, K = 4. Each row: τ, first-token acceptance, Δτ over ``--base`` with its 95%
paired-bootstrap interval between prompts (greedy blocks: decoding is deterministic, so the spread is the prompts'),
the speedup over plain decoding and over the fastest plain decoding of the block, and greedy exactness. Each block is
saved in ``--out`` once scored and reused, so an interrupted run resumes at the next block. Writes
``benchmarks/results/{--results}.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import (
    RESULTS,
    decoding_modes,
    gain_cell,
    heldout_sets,
    machine,
    measured_on,
    plain_lines,
    saved_block,
    score_block,
    smollm2_targets,
    write,
)

from draftsmith.core.manifest import file_sha256
from draftsmith.eval.rows import read_block
from draftsmith.families.specs import Trained

MODES = decoding_modes()
SETS = ("mt-bench", "chat-heldout")
FIT_SECONDS = ("train_process_seconds", "fit_seconds", "seconds")
"""A fit record's wall-clock of training, validation included where the record has it (speculators' harness:
``train_process_seconds``; SpecForge's: ``fit_seconds``; ``scaling.fit_one``: ``seconds``, its export included)."""


def drafter_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--drafter {text}: expected NAME=DIR")
    return name, Path(path)


def fit_record(drafter: Path) -> dict | None:
    """The fit record beside ``drafter`` (``DIR/fit.json``, ``DIR/../fit.json``, or a scaling study's
    ``STUDY/fit/NAME.json``), its figures under one set of names: ``tokens`` (generated tokens of the data, one
    pass), ``passes``, ``seconds`` (``FIT_SECONDS``), ``tokens_per_s`` (generated tokens trained per second, every
    trainer's by the same rule), ``peak_rss_gb``, ``steps``, ``load`` and ``val_tau_est`` where recorded."""
    for path in (
        drafter / "fit.json",
        drafter.parent / "fit.json",
        drafter.parent.parent / "fit" / f"{drafter.name}.json",
    ):
        if path.is_file():
            r = json.loads(path.read_text())
            tokens = r.get("tokens") or r.get("generated_tokens")
            passes = r.get("passes") if r.get("passes") is not None else r.get("epochs")
            seconds = next((r[k] for k in FIT_SECONDS if r.get(k)), None)
            peak = r.get("peak_rss_gb") or (r["peak_rss_mib"] / 1024 if r.get("peak_rss_mib") else None)
            rate = round(tokens * passes / seconds, 1) if tokens and passes and seconds else None
            validating, training = validation_seconds(r, seconds)
            alone = round(tokens * passes / training, 1) if tokens and passes and training else None
            return {
                "trainer": r.get("trainer", "draftsmith"),
                "tokens": tokens,
                "passes": passes,
                "steps": r.get("steps"),
                "seconds": seconds,
                "tokens_per_s": rate,
                **({"validation_seconds": validating, "train_tokens_per_s": alone} if training else {}),
                "peak_rss_gb": peak,
                "load": r.get("load"),
                "val_tau_est": r.get("val_tau_est"),
                "record": str(path),
            }
    return None


def validation_seconds(record: dict, seconds: float | None) -> tuple[float | None, float | None]:
    """(validation seconds, training seconds without them) of a fit record, or (None, None) where it did not time its
    validations apart: draftsmith's ``validation_seconds`` (``train.cli.ValidationClock``) out of its wall-clock (its
    export and the target's loading stay in); speculators' harness: its epochs' ``fit_seconds`` (training alone) beside
    ``val_seconds``; SpecForge's trainer validates nothing (``fit_seconds``: its ``specforge train`` process, start-up
    and checkpoint included)."""
    trainer = record.get("trainer", "draftsmith")
    if trainer == "draftsmith" and record.get("validation_seconds") is not None and seconds:
        return record["validation_seconds"], seconds - record["validation_seconds"]
    if trainer == "speculators" and record.get("val_seconds") is not None:
        return record["val_seconds"], record.get("fit_seconds")
    if trainer == "specforge" and record.get("fit_seconds"):
        return 0.0, record["fit_seconds"]
    return None, None


def markdown(result: dict) -> str:
    decoded = (
        f"; verified target in {result['dtype']}; {result['prompts']} prompts × {result['max_new_tokens']} new tokens "
        "per set. Every row of a block was decoded in one run, interleaved prompt by prompt with plain decoding; Δτ is "
        f"over the base (`{result['base']}`), the mean per-prompt difference with its 95% paired-bootstrap interval."
        if result["blocks"]
        else ". The fits alone (`--fits-only`): each trainer's record as it wrote it, nothing decoded."
    )
    lines = [
        "# The peers' trainers beside draftsmith's (SmolLM2-135M-Instruct)",
        "",
        f"Measured on {measured_on(result['machine'])}"
        + (f"; decoded on one {gpu}" if (gpu := result["machine"].get("gpu")) else "")
        + decoded,
        "",
        "## The fits",
        "",
    ]
    # the validations timed apart: a column where any record has them (the reports before ValidationClock have none)
    apart = any((d.get("fit") or {}).get("train_tokens_per_s") for d in result["drafters"].values())
    extra = " validation s | tokens/s, training alone |" if apart else ""
    lines += [
        f"| drafter | trainer | tokens | passes | steps | fit s | tokens/s |{extra} peak GB | load | val τ_est |",
        "|---|---|---|---|---|---|---|" + "---|" * (2 if apart else 0) + "---|---|---|",
    ]
    for name, d in result["drafters"].items():
        f = d.get("fit") or {}

        def cell(key: str, fmt: str = "{}", f: dict = f) -> str:
            return fmt.format(f[key]) if f.get(key) is not None else "–"

        alone = f" {cell('validation_seconds', '{:.0f}')} | {cell('train_tokens_per_s', '{:,.0f}')} |" if apart else ""
        lines.append(
            f"| {name} | {cell('trainer')} | {cell('tokens', '{:,}')} | {cell('passes', '{:.2f}')} | {cell('steps')} "
            f"| {cell('seconds', '{:.0f}')} | {cell('tokens_per_s', '{:,.0f}')} |{alone} {cell('peak_rss_gb', '{:.1f}')} "
            f"| {cell('load')} | {cell('val_tau_est', '{:.2f}')} |"
        )
    if not result["blocks"]:  # --fits-only
        return "\n".join(lines) + "\n"
    lines += ["", "## Decoding", ""]
    lines += plain_lines(result["blocks"])
    lines += [
        "",
        "| set | mode | drafter | K | τ | first-token acc. | Δτ vs base [95%] | × plain | × fastest plain | exact |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, block in result["blocks"].items():
        set_name, mode = key.split(" ")
        plain, rows = read_block(block)
        base = next((r for r in rows if r.name == result["base"]), None)
        for r in rows:
            k = f"{r.auto_k.k}" if r.auto_k else str(r.k)
            exact = f"{r.greedy_exact}/{r.prompts}" if r.greedy_exact is not None else "–"
            fastest = r.tokens_per_s / plain.fastest.tokens_per_s
            lines.append(
                f"| {set_name} | {mode} | {r.name} | {k} | {r.tau:.2f} | {r.accept_at[0]:.2f} | {gain_cell(base, r)} "
                f"| {r.speedup:.2f}× | {fastest:.2f}× | {exact} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", type=drafter_arg, action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--base", default="draftsmith", help="the drafter every Δτ is over")
    parser.add_argument("--out", type=Path, default=Path("runs/peers/blocks"))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--results", default="peers_smollm2")
    parser.add_argument(
        "--fits-only", action="store_true", help="the fits' table alone (no decoding: DIR needs no drafter)"
    )
    parser.add_argument("--target", default=None, help="SmolLM2's dir (default: the built-in's)")
    parser.add_argument("--device", default="auto", help="where the blocks decode (auto: cuda where torch sees one)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the report goes (a GPU run: $OUT)")
    parser.add_argument("--sha", default=None, help="the git SHA measured (a device's copy has no .git)")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA GPU here")
    drafters = dict(args.drafter)
    if args.base not in drafters:
        parser.error(f"--base {args.base}: not one of the --drafter names ({' '.join(drafters)})")
    if args.fits_only:
        if missing := [f"{n}={p}" for n, p in drafters.items() if fit_record(p) is None]:
            parser.error(f"--drafter {' '.join(missing)}: no fit record beside it (fit.json, or STUDY/fit/NAME.json)")
        fits = {name: {"dir": str(path), "fit": fit_record(path)} for name, path in drafters.items()}
        result = {"machine": stamp(args), "target": "smollm2", "dtype": None, "base": args.base, "prompts": 0,
                  "max_new_tokens": 0, "drafters": fits, "blocks": {}}  # fmt: skip
        write(args.results, result, markdown(result), args.results_dir)
        return
    if missing := [f"{n}={p}" for n, p in drafters.items() if not (p / "config.json").is_file()]:
        parser.error(f"--drafter {' '.join(missing)}: no drafter there (no config.json); train and import it first")

    dtype, verified, references = smollm2_targets(float32=True, path=args.target, device=args.device)
    sets = {k: v for k, v in heldout_sets(verified.tokenizer, args.num_prompts).items() if k in args.sets}
    names = list(drafters)
    specs = {name: Trained(str(path)) for name, path in drafters.items()}
    blocks = {}
    for mode in args.modes:
        for set_name, (prompts, categories) in sets.items():
            key = f"{set_name} {mode}"
            blocks[key] = saved_block(
                args.out / f"{set_name}-{mode}.json",
                names,
                lambda: score_block(verified, references, specs, prompts, categories,  # noqa: B023
                                    args.max_new_tokens, mode),  # noqa: B023
            )  # fmt: skip
    result = {
        "machine": stamp(args),
        "target": "smollm2",
        "dtype": dtype,
        "base": args.base,
        "prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "drafters": {
            name: {"dir": str(path), "weights": file_sha256(path / "model.safetensors"), "fit": fit_record(path)}
            for name, path in drafters.items()
        },
        "blocks": blocks,
    }
    write(args.results, result, markdown(result), args.results_dir)


def stamp(args: argparse.Namespace) -> dict:
    """``machine()`` with ``--sha`` for its git SHA where given, and the GPU that decoded (``gpu``)."""
    m = machine() | ({"git": args.sha} if args.sha else {})
    return m | ({"gpu": torch.cuda.get_device_name(args.device)} if args.device.startswith("cuda") else {})


if __name__ == "__main__":
    main()
