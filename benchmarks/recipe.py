"""The recipe study on SmolLM2-135M-Instruct: drafters trained on the same packed 1M-token corpus, each change of
recipe scored against the base recipe on the same prompts, beside the n-gram that needs no training.

    python benchmarks/recipe.py [--study runs/study] [--drafters eagle3-1M eagle3_31-1M] [--base eagle3-1M]
        [--add eagle3_31_16k-1M] [--out runs/recipe] [--num-prompts 32] [--max-new-tokens 128]
        [--modes greedy auto sampled]

The drafters are ``benchmarks/scaling.py --out STUDY --sizes 1000000 --families ...`` fits on the repository's
packed corpus (``STUDY/drafters/NAME``, each fit's record, its steps, seconds and val τ_est, in ``STUDY/fit``); a
recipe differs from the base by what its YAML changes (``configs/smollm2/``). One block per held-out set (MT-bench
first turns, N / 8 per category; chat-heldout) and mode, every decoder interleaved prompt by prompt in one run
(``score_drafters``): plain decoding of the verified target (bf16 batch-invariant on a CPU with native bf16, else
float32), plain decoding of the same weights with the fastest kernels (the fastest-plain reference; float32 too
with ``--float32``), the n-gram drafter and every drafter. Modes: ``greedy`` chains at K = 4, ``auto`` (``--k
auto``: each drafter's fastest shape on this machine), ``sampled`` at T 0.7 / top-p 0.9, K = 4, for the winner (the
trained drafter fastest over both greedy blocks) and the base. A drafter trained after the main blocks were scored
joins with ``--add NAME``: greedy and ``auto`` blocks of its own, NAME and the n-gram, and sampled ones where it wins
(the main sampled blocks kept as measured; its Δτ paired with the base's prompts of the main block: greedy decoding
is deterministic, the same tokens in every run), so adding a row costs its own decoding and the n-gram's, not the
study's. The report itself keeps what a new workspace loses: where ``--out`` and the study no longer hold a block or
a fit, those of ``--results``' earlier JSON stand in when it measured the same work on this machine
(``earlier_result``), so a drafter trained in a later session joins without the base being trained and decoded
again; a run of some ``--modes`` keeps the report's blocks of the others as they were measured (the report says when
its sampled blocks lack a winner scored since).

Each row gives τ beside the fit's val τ_est, first-token acceptance, the speedup over plain decoding of the same
target and over the fastest plain decoding of the block, and, for greedy blocks, the gain in τ over the base with the
spread between prompts (``metrics.tau_gain``: the mean per-prompt difference and its 95% paired-bootstrap interval;
greedy decoding is deterministic, so the spread is the prompts'). Each block is saved in ``--out`` once scored and
reused, so an interrupted run resumes at the next block. Writes ``benchmarks/results/recipe_smollm2.{json,md}``
(``--results``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

import common
from common import (
    RESULTS,
    decoding_modes,
    draft_vocab_coverage,
    gain_cell,
    heldout_sets,
    machine,
    measured_on,
    plain_lines,
    saved_block,
    smollm2_targets,
    write,
)
from scaling import RECIPES

from draftsmith.core.files import write_whole
from draftsmith.core.machine import native_bf16
from draftsmith.core.manifest import file_sha256
from draftsmith.core.target import Target
from draftsmith.eval.rows import read_block
from draftsmith.families.specs import NGram, Trained
from draftsmith.train.learning_curve import tokens_of
from draftsmith.train.recorded import fit_epochs

MODES = decoding_modes()
SETS = ("mt-bench", "chat-heldout")
GOALS = {"mt-bench": {"tau": 1.9, "first": 0.45, "fastest": 1.3}, "chat-heldout": {"tau": 2.3, "fastest": 1.6}}
"""Issue 51's goals for the study's winner, greedy, K = 4."""


def score_block(verified: Target, references: dict, study: Path, names: list[str], prompts, categories, n, mode):
    specs = {name: NGram() if name == "ngram" else Trained(str(study / "drafters" / name)) for name in names}
    return common.score_block(verified, references, specs, prompts, categories, n, mode)


class BlockKey(NamedTuple):
    """A block's name in the results: its prompt set, its mode and, for ``--add NAME``'s blocks, NAME; written
    ``"mt-bench greedy"`` / ``"mt-bench greedy +NAME"`` (the JSON's keys), saved as OUT/mt-bench-greedy.json /
    OUT/mt-bench-greedy+NAME.json."""

    set_name: str
    mode: str
    added: str = ""

    @classmethod
    def parse(cls, text: str) -> BlockKey:
        set_name, mode, *added = text.split(" ")
        return cls(set_name, mode, "".join(added).removeprefix("+"))

    @property
    def label(self) -> str:
        """The mode column of the table: ``greedy``, or ``greedy +NAME`` for ``--add``'s blocks."""
        return self.mode + (f" +{self.added}" if self.added else "")

    def __str__(self) -> str:
        return f"{self.set_name} {self.label}"

    def file(self, out: Path) -> Path:
        return out / f"{self.set_name}-{self.label.replace(' ', '')}.json"


def winner(blocks: dict, names: list[str]) -> str:
    """The trained drafter fastest over the greedy K = 4 blocks (the mean of its speedups, each over its own run's
    plain decoding)."""
    speed = {}
    for key, block in blocks.items():
        if BlockKey.parse(key).mode == "greedy":
            for r in read_block(block)[1]:
                speed.setdefault(r.name, []).append(r.speedup)
    return max(names, key=lambda n: sum(speed.get(n, [0])) / len(speed.get(n, [0])))


def base_row(result: dict, key: str):
    """The base's row for a block's Δτ: its own, or (an ``--add`` block) the base's in the set's first block of the
    same mode, when both decoded the same work (plain decoding gave the same tokens: greedy is deterministic)."""
    plain, rows = read_block(result["blocks"][key])
    this = BlockKey.parse(key)
    for other, block in result["blocks"].items():
        if BlockKey.parse(other)[:2] == this[:2]:
            other_plain, other_rows = read_block(block)
            base = next((r for r in other_rows if r.name == result["base"]), None)
            if base is not None and other_plain.tokens == plain.tokens:
                return base
    return None


def data_sizes(fits: dict) -> list[str]:
    """The data budgets of the study's drafters, from their names (``scaling.fit_one``'s ``FAMILY-SIZE``)."""
    return sorted({name.rsplit("-", 1)[1] for name in fits}, key=tokens_of)


def markdown(result: dict) -> str:
    has_references = any(read_block(b)[0].references for b in result["blocks"].values())
    sizes = data_sizes(result["fits"])
    lines = [
        "# The recipe study on SmolLM2-135M-Instruct: drafters of one packed corpus against its base recipe",
        "",
        f"{measured_on(result['machine'])}. Target `{result['target']}` ({result['dtype']}); every drafter trained "
        f"on the packed corpus's first {' / '.join(sizes)} generated tokens (`{result['study']}`); {result['prompts']} prompts × "
        f"{result['max_new_tokens']} new tokens per set. Every row of a block was decoded in one run, interleaved "
        "prompt by prompt with plain decoding of the verified target"
        + (" and of the fastest-kernel reference." if has_references else " (this machine's fastest plain decoding)."),
        "",
        "| drafter | recipe | fit steps | epochs | fit s | val τ_est | draft vocab. covers |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, fit in result["fits"].items():
        tau = f"{fit['val_tau_est']:.2f}" if fit.get("val_tau_est") else "–"
        if "vocab_coverage" not in fit:  # a result saved before it was measured
            covers = "–"
        else:
            covers = "all" if fit["vocab_coverage"] is None else f"{fit['vocab_coverage']:.1%}"
        lines.append(
            f"| {name} | `{fit['recipe']}` | {fit['steps']} | {fit['epochs']} | {fit['seconds']:.0f} | {tau} | "
            f"{covers} |"
        )
    lines += [
        "",
        f"| set | mode | drafter | K | τ | val τ_est | first-token acc. | Δτ vs {result['base']} [95%] | speedup | "
        "× fastest plain | greedy exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, block in result["blocks"].items():
        parsed = BlockKey.parse(key)
        plain, rows = read_block(block)
        base = base_row(result, key)
        for r in rows:
            fit = result["fits"].get(r.name, {})
            val = f"{fit['val_tau_est']:.2f}" if fit.get("val_tau_est") else "–"
            first = f"{r.accept_at[0]:.2f}" if r.accept_at else "–"
            gain = gain_cell(base, r) if parsed.mode == "greedy" else "–"
            # the fastest-plain goals are greedy ones (sampled blocks decode no reference)
            greedy = parsed.mode != "sampled"
            fastest = f"{r.tokens_per_s / plain.fastest.tokens_per_s:.2f}×" if plain.references or greedy else "–"
            exact = f"{r.greedy_exact}/{r.prompts}" if r.greedy_exact is not None else "– (sampled)"
            lines.append(
                f"| {parsed.set_name} | {parsed.label} | {r.name} | {r.k} | {r.tau:.2f} | {val} | {first} | {gain} | "
                f"{r.speedup:.2f}× | {fastest} | {exact} |"
            )
    lines += plain_lines(result["blocks"])
    lines += ["", "## Goals (issue 51)", ""]
    if sizes == ["1M"]:
        lines += [f"- {line}" for line in goals(result)]
        if note := unsampled_winner(result):
            lines.append(f"- {note}")
    else:  # the goals are set for drafters of the fixed 1M-token corpus
        lines += [
            f"- not judged here: the goals are for drafters of the 1M-token corpus, these are of {' / '.join(sizes)}"
        ]
    lines += [
        "",
        f"Δτ vs {result['base']}: the mean over prompts of each prompt's τ minus the base's on the same prompt, its "
        "95% interval (paired bootstrap over the prompts) and the prompts whose τ rose (↑) or fell (↓); greedy "
        "decoding is deterministic, so the interval is the prompts' spread: a gain whose interval excludes 0 is not "
        "noise."
        + (
            " A block `greedy +NAME` (`--add`) decoded NAME and the n-gram in a run of their own (the rows scored "
            "before were not decoded again); its Δτ pairs NAME's prompts with the base's of the set's first block "
            "(greedy decoding gives the same tokens in every run)."
            if any(BlockKey.parse(key).added for key in result["blocks"])
            else ""
        )
        + " speedup: over plain decoding of the verified target (same dtype and numerics). × fastest plain: over "
        "the fastest plain decoding of the block (the fastest-kernel reference where it is faster). draft vocab. "
        "covers: the share of the validation answers' generated tokens (the target's own, the packed "
        "`smollm2-val`) that the drafter's draft vocabulary holds; a token outside it is never drafted (all: the "
        "full vocabulary).",
    ]
    return "\n".join(lines) + "\n"


def decoded_by(result: dict, name: str) -> dict[tuple[str, str], tuple]:
    """(set, mode) -> (plain, {drafter: row}) of the first block of that set and mode (the main block before ``--add``'s)
    that decoded ``name``, in the report's block order."""
    out = {}
    for key, block in result["blocks"].items():
        plain, rows = read_block(block)
        by = {r.name: r for r in rows}
        if name in by:
            out.setdefault(BlockKey.parse(key)[:2], (plain, by))
    return out


def goals(result: dict) -> list[str]:
    """Issue 51's goals for the study's winner (``winner``: one drafter for every greedy K = 4 block, the one the
    sampled blocks score; a per-block pick would crown a drafter for a speed difference within the noise)."""
    best_name = winner(result["blocks"], list(result["fits"]))
    out = []
    for (set_name, mode), (plain, by) in decoded_by(result, best_name).items():
        if mode != "greedy":
            continue
        best, goal = by[best_name], GOALS[set_name]
        line = f"{set_name}: the winner {best.name}: τ {best.tau:.2f} (goal ≥ {goal['tau']})"
        if "first" in goal:
            line += f", first-token acceptance {best.accept_at[0]:.2f} (goal ≥ {goal['first']})"
        if "ngram" in by:
            line += f"; {best.tokens_per_s / by['ngram'].tokens_per_s:.2f}× the n-gram's speed (goal > 1)"
        line += (
            f"; {best.tokens_per_s / plain.fastest.tokens_per_s:.2f}× the fastest plain decoding (goal ≥ "
            f"{goal['fastest']}×)"
        )
        out.append(line)
    return out


def unsampled_winner(result: dict) -> str | None:
    """Why the sampled blocks lack the winner, when they do: they were decoded before it was scored (a run of other
    ``--modes`` keeps them as measured); None when each set's sampled blocks (main or ``+NAME``) decode it, or there
    is none."""
    by_set: dict[str, set] = {}  # a set's sampled blocks (main and ``+NAME``) -> the names they decoded
    for key, b in result["blocks"].items():
        if (k := BlockKey.parse(key)).mode == "sampled":
            by_set.setdefault(k.set_name, set()).update(r.name for r in read_block(b)[1])
    best = winner(result["blocks"], list(result["fits"]))
    if not by_set or all(best in names for names in by_set.values()):
        return None
    names = sorted(set().union(*by_set.values()) - {"ngram"})
    return (
        f"the sampled blocks decoded {', '.join(names)} (the winner when they were scored); the winner now, {best}, "
        "is not sampled yet (`--modes sampled` decodes it: an --add drafter in blocks of its own beside the n-gram)"
    )


def earlier_result(path: Path, here: dict, dtype: str, prompts: int, max_new_tokens: int, study: Path) -> dict:
    """The report ``path`` (results/NAME.json) written by an earlier run of the same work on this machine (the same
    CPU and flags, threads, torch, dtype, prompts and tokens), or {}: its blocks and fit records stand in for the
    ones a new workspace lost (``--out``'s saved blocks, the study's drafters), so that a drafter trained later joins
    with ``--add`` at the cost of its own decoding, not the base's fit and decoding again. A drafter the study holds
    other weights of than the report scored (``same_drafter``: trained again, or changed) is dropped from it with
    every block that decoded it: those are scored again."""
    if not path.is_file():
        return {}
    result = json.loads(path.read_text())
    same_machine = all(result["machine"].get(k) == here.get(k) for k in ("cpu", "cpu_flags", "threads", "torch"))
    same_work = (result["dtype"], result["prompts"], result["max_new_tokens"]) == (dtype, prompts, max_new_tokens)
    if not (same_machine and same_work):
        return {}
    stale = {name for name, fit in result["fits"].items() if not same_drafter(study, name, fit)}
    result["fits"] = {name: fit for name, fit in result["fits"].items() if name not in stale}
    result["blocks"] = {key: block for key, block in result["blocks"].items()
                        if not stale & {row["name"] for row in block["drafters"]}}  # fmt: skip
    return result


def same_drafter(study: Path, name: str, fit: dict) -> bool:
    """Whether the drafter ``name`` of the study is the one a report's ``fit`` record describes: the same weights
    (their hash, recorded from this version on; before, the same val τ_est), or none in the study (lost)."""
    weights = study / "drafters" / name / "model.safetensors"
    if not weights.is_file():
        return True
    if "weights" in fit:
        return fit["weights"] == file_sha256(weights)
    record = study / "fit" / f"{name}.json"
    return record.is_file() and json.loads(record.read_text()).get("val_tau_est") == fit.get("val_tau_est")


def fit_records(study: Path, names: list[str], earlier: dict | None = None) -> dict:
    """Each drafter's fit record (``scaling.fit_one``'s, ``train.recorded``'s) with its epochs, the recipe it was
    trained with, its weights' hash and its draft vocabulary's coverage of the study's validation answers
    (``vocab_coverage``); the ``earlier`` report's record where it has one (``earlier_result`` kept it: the same
    drafter, or one the study no longer holds)."""
    fits = {}
    for name in names:
        record = study / "fit" / f"{name}.json"
        if name in (earlier or {}):
            fits[name] = earlier[name]
        elif record.is_file():
            fit = json.loads(record.read_text())
            drafter = study / "drafters" / name
            fits[name] = fit | {
                "epochs": fit_epochs(fit),
                "recipe": RECIPES[name.rsplit("-", 1)[0]],
                "vocab_coverage": draft_vocab_coverage(drafter, study / "data" / "val"),
                "weights": file_sha256(drafter / "model.safetensors"),
            }
    return fits


def held(key: BlockKey, out: Path, earlier: dict) -> dict | None:
    """The block ``key`` saved in ``out``, else the ``earlier`` report's (``earlier_result``), else None."""
    path = key.file(out)
    return json.loads(path.read_text()) if path.is_file() else earlier.get("blocks", {}).get(str(key))


def saved_blocks(args, earlier: dict) -> dict:
    """The greedy blocks held (``held``; the sampled mode's drafter is their winner) and the main sampled ones."""
    keys = [BlockKey(s, "greedy", added) for s in args.sets for added in ["", *args.add]]
    keys += [BlockKey(s, "sampled") for s in args.sets]
    return {str(k): b for k in keys if (b := held(k, args.out, earlier)) is not None}


def decoders(block: dict) -> list[str]:
    """The names a saved block decoded, in its order."""
    from draftsmith.eval.rows import read_rows

    return [r.name for r in read_rows(block["drafters"])]


def planned(args, sets: list[str], scored: dict, trained: list[str], modes=None) -> list[tuple[BlockKey, list[str]]]:
    """Each block of ``modes`` (``--modes``) with the decoders it runs, in order: the main blocks (every
    ``--drafters`` row and the n-gram), ``--add``'s greedy and auto blocks (NAME and the n-gram), the sampled blocks
    (the base and the winner of the greedy blocks ``scored``; every trained drafter while none is scored). A winner
    joined with ``--add`` gets sampled blocks of its own (it and the n-gram) and the main sampled blocks stay as
    ``scored`` holds them (else the base and the n-gram), so sampling the winner does not decode the base again. A
    block saved in ``--out`` with the same decoders is reused by ``saved_block``, not decoded again."""
    out = []
    for mode in [m for m in MODES if m in (modes or args.modes)]:
        runs = {"": {s: [*args.drafters, "ngram"] for s in sets}}  # added name ("": main) -> set -> its decoders
        if mode in ("greedy", "auto"):
            runs |= {name: {s: [name, "ngram"] for s in sets} for name in args.add}
        if mode == "sampled":
            greedy = {k: b for k, b in scored.items() if BlockKey.parse(k).mode == "greedy"}
            best = winner(greedy, trained) if greedy else None
            if best in args.add:
                main = {s: scored.get(str(BlockKey(s, "sampled"))) for s in sets}
                runs = {"": {s: decoders(b) if b else [args.base, "ngram"] for s, b in main.items()},
                        best: {s: [best, "ngram"] for s in sets}}  # fmt: skip
            else:
                runs = {"": {s: [*dict.fromkeys([args.base, *([best] if best else trained)]), "ngram"] for s in sets}}
        out += [(BlockKey(s, mode, added), by_set[s]) for added, by_set in runs.items() for s in sets]
    return out


def other_modes(earlier: dict, modes: list[str]) -> dict:
    """The ``earlier`` report's blocks of the modes this run does not score (``--modes``): a run of some modes
    keeps the report's others as they were measured, rather than dropping them."""
    return {key: b for key, b in earlier.get("blocks", {}).items() if BlockKey.parse(key).mode not in modes}


def in_mode_order(blocks: dict) -> dict:
    """``blocks`` in the report's order: by mode (``MODES``), each mode's blocks as they came."""
    order = list(MODES)
    return dict(sorted(blocks.items(), key=lambda item: order.index(BlockKey.parse(item[0]).mode)))


def unsaved(key: BlockKey, names: list[str], out: Path, earlier: dict) -> bool:
    """Whether the block ``key`` of ``names`` is still to be decoded (none held, or one of other decoders)."""
    block = held(key, out, earlier)
    return block is None or decoders(block) != names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=Path("runs/study"), help="benchmarks/scaling.py's --out")
    parser.add_argument("--drafters", nargs="+", default=["eagle3-1M", "eagle3_31-1M"], help="names in STUDY/drafters")
    parser.add_argument("--base", default="eagle3-1M", help="the recipe every other is compared with")
    parser.add_argument("--add", action="append", default=[], metavar="NAME",
                        help="a drafter scored beside the n-gram in greedy and auto blocks of its own (repeatable): the "
                             "rows of --drafters, scored before, are not decoded again")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/recipe"))
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--float32", action="store_true", help="float32 plain decoding as a reference too")
    parser.add_argument("--results", default="recipe_smollm2")
    args = parser.parse_args()
    if args.base not in args.drafters:
        parser.error(f"--base {args.base}: not one of --drafters ({' '.join(args.drafters)})")
    if both := sorted(set(args.add) & set(args.drafters)):
        parser.error(f"--add {' '.join(both)}: already one of --drafters (scored in the main blocks)")

    dtype = "bfloat16" if native_bf16()[0] else "float32"  # smollm2_targets' choice, known before loading them
    here = machine()
    earlier = earlier_result(RESULTS / f"{args.results}.json", here, dtype, args.num_prompts,
                             args.max_new_tokens, args.study)  # fmt: skip
    trained = [*args.drafters, *args.add]
    to_score = [(k, names) for k, names in planned(args, args.sets, saved_blocks(args, earlier), trained)
                if unsaved(k, names, args.out, earlier)]  # fmt: skip
    needed = {n for _, names in to_score for n in names} - {"ngram"}
    missing = sorted(n for n in needed if not (args.study / "drafters" / n / "config.json").is_file())
    if missing:
        parser.error(
            f"no trained drafter {', '.join(missing)} in {args.study / 'drafters'} (blocks to score "
            f"decode it; no saved block in {args.out} or earlier {args.results}.json holds them)"
        )

    dtype, verified, references = smollm2_targets(args.float32)
    sets = {k: v for k, v in heldout_sets(verified.tokenizer, args.num_prompts).items() if k in args.sets}
    blocks = {}
    for mode in [m for m in MODES if m in args.modes]:
        if mode == "sampled" and not saved_blocks(args, earlier):  # greedy blocks scored are saved
            parser.error("--modes sampled: its drafter is the greedy blocks' winner; score --modes greedy first")
        for key, names in planned(args, list(sets), saved_blocks(args, earlier) | blocks, trained, [mode]):
            prompts, categories = sets[key.set_name]
            if not key.file(args.out).is_file() and (block := held(key, args.out, earlier)):
                write_whole(key.file(args.out), json.dumps(block, indent=2))  # the report's block, reused
            blocks[str(key)] = saved_block(
                key.file(args.out),
                names,
                lambda: score_block(verified, references, args.study, names, prompts, categories,  # noqa: B023
                                    args.max_new_tokens, key.mode),  # noqa: B023
            )  # fmt: skip
    blocks = in_mode_order(blocks | other_modes(earlier, args.modes))
    result = {
        "machine": here,
        "target": "smollm2",
        "dtype": dtype,
        "study": str(args.study),
        "base": args.base,
        "fits": fit_records(args.study, trained, earlier.get("fits")),
        "prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "blocks": blocks,
    }
    write(args.results, result, markdown(result), RESULTS)


if __name__ == "__main__":
    main()
