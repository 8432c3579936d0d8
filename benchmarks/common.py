"""Helpers shared by the benchmark scripts: where results go and what machine made them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from draftsmith.core.target import Target

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository's engine harnesses (``engines/``), beside the package
    sys.path.append(str(ROOT))
RESULTS = Path(__file__).parent / "results"
HELDOUT = {"default": "builtin:heldout", "smollm2": "builtin:chat-heldout"}
"""Each built-in target's held-out prompt set, what the decoding benchmarks score on."""


def mtbench_subset(n: int) -> list:
    """``n`` MT-bench first turns: the first n / 8 questions of each of its 8 categories."""
    from draftsmith.data.prompts import load_prompts

    per, picked = max(1, n // 8), {}
    for p in load_prompts("builtin:mt-bench"):
        group = picked.setdefault(p.category, [])
        if len(group) < per:
            group.append(p)
    return [p for group in picked.values() for p in group]


def prompt_ids(source: str, tokenizer, n: int | None = None) -> list[list[int]]:
    """The first ``n`` prompts of ``source`` (a ``load_prompts`` name: ``HELDOUT``'s, ``builtin:train``), encoded with
    ``tokenizer``'s chat template: what a decoding block decodes."""
    from draftsmith.data.prompts import encode, load_prompts

    return [encode(p, tokenizer) for p in load_prompts(source, limit=n)]


class Load:
    """The machine's one-minute load average when made; ``span()``: [then, now], rounded, a result's ``load`` (what
    the reports print beside their tokens/s)."""

    def __init__(self) -> None:
        self.before = os.getloadavg()[0]

    def span(self) -> list[float]:
        return [round(self.before, 2), round(os.getloadavg()[0], 2)]


def heldout_sets(tokenizer, n: int) -> dict[str, tuple[list[list[int]], list | None]]:
    """The two held-out sets SmolLM2's benchmarks score on, encoded: ``mt-bench`` (``mtbench_subset(n)``, with each
    prompt's category) and ``chat-heldout`` (its first ``n``): name -> (prompts, categories or None)."""
    from draftsmith.data.prompts import encode

    mt = mtbench_subset(n)
    return {
        "mt-bench": ([encode(p, tokenizer) for p in mt], [p.category for p in mt]),
        "chat-heldout": (prompt_ids("builtin:chat-heldout", tokenizer, n), None),
    }


def draft_vocab_coverage(drafter: Path, data: Path) -> float | None:
    """The share of ``data``'s generated tokens (a generated dataset's dir: the target's own answers) that
    ``drafter``'s draft vocabulary holds (its ``t2d`` mask): a token outside it is never drafted, so the share bounds
    the acceptance of every position. None for a drafter that drafts over the full vocabulary."""
    import datasets
    from safetensors import safe_open

    from draftsmith.train.data import generated_token_counts

    with safe_open(str(drafter / "model.safetensors"), "pt") as f:
        if "t2d" not in f.keys():  # noqa: SIM118 (safe_open has no `in`)
            return None
        held = f.get_tensor("t2d").bool()
    counts = generated_token_counts(datasets.load_from_disk(str(data)), len(held))
    return int(counts[held].sum()) / int(counts.sum())


def machine() -> dict:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        sha = ""
    from draftsmith.core.machine import machine_record

    return machine_record() | {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "git": sha,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }


def measured_on(m: dict) -> str:
    """A report's provenance from its ``machine()`` record: command, git SHA, date, CPU and flags, threads, torch."""
    return (
        f"`{m['command']}` at `{m['git']}` on {m['date']}: {m['cpu']} ({', '.join(m['cpu_flags'])}), "
        f"{m['threads']} threads, torch {m['torch']}"
    )


def saved(path: Path, run, keep=lambda saved: True) -> dict:
    """``run()``'s result computed once and saved whole (a kill mid-write leaves no half file to resume from), so an
    interrupted benchmark resumes; a saved result that ``keep`` refuses is computed again."""
    from draftsmith.core.files import write_whole

    if path.is_file():
        saved = json.loads(path.read_text())
        if keep(saved):
            return saved
    result = run()
    write_whole(path, json.dumps(result, indent=2))
    return result


def saved_block(path: Path, names: list[str], run) -> dict:
    """A scored block's result, computed once (``run()``) and saved with the git SHA and date it was measured at, so
    an interrupted benchmark resumes; a saved block of other drafters is computed again."""
    from draftsmith.eval.rows import read_rows

    def stamped() -> dict:
        m = machine()
        return run() | {"measured": {"git": m["git"], "date": m["date"]}}

    return saved(path, stamped, lambda block: [row.name for row in read_rows(block["drafters"])] == names)


def smollm2_targets(
    float32: bool = False, path: str | Path | None = None, device: str = "cpu"
) -> tuple[str, Target, dict[str, Target]]:
    """(dtype, verified target, fastest-plain references) of the SmolLM2 decoding blocks: the target draftsmith
    verifies with (bf16 batch-invariant where this CPU has native bf16, else float32; bf16 on a GPU) and the same
    weights with the fastest kernels (bf16 SDPA; float32 too with ``float32``, on a CPU), decoded plainly in the same
    run. ``path``: SmolLM2's dir (default: the built-in's); ``device``: where they run."""
    from draftsmith.core.machine import native_bf16
    from draftsmith.core.target import Target
    from draftsmith.targets import resolve

    dtype = "bfloat16" if device != "cpu" or native_bf16()[0] else "float32"
    path = path or resolve("smollm2")
    references = {}
    if dtype == "bfloat16":
        references["bf16 fast kernels"] = Target.from_pretrained(
            path, dtype="bfloat16", device=device, batch_invariant=False
        )
    if float32 and dtype != "float32" and device == "cpu":
        references["float32"] = Target.from_pretrained(path, dtype="float32")
    return dtype, Target.from_pretrained(path, dtype=dtype, device=device), references


def plain_lines(blocks: dict) -> list[str]:
    """The lines under a report's table: each block's plain decoding (the verified target's and the references'),
    machine load and when it was measured."""
    from draftsmith.eval.rows import read_block

    lines = ["", "Plain decoding per block (tokens/s; load average before and after):", ""]
    for key, block in blocks.items():
        plain, _ = read_block(block)
        refs = "".join(f"; {n} {p.tokens_per_s:.1f}" for n, p in (plain.references or {}).items())
        lines.append(
            f"- {key}: verified target {plain.tokens_per_s:.1f}{refs}; load {block['load']}{measured_at(block)}"
        )
    return lines


def measured_at(block: dict) -> str:
    """``; measured at `SHA` on DATE`` for a block ``saved_block`` saved (empty for a block saved before it recorded
    that), for the line under a report's table."""
    at = block.get("measured", {})
    return f"; measured at `{at['git']}` on {at['date']}" if at else ""


def write(name: str, data: dict, markdown: str, results: Path = RESULTS) -> None:
    """``results/NAME.json`` and ``.md`` (``results``: ``benchmarks/results`` unless a test writes elsewhere)."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(data, indent=2))
    (results / f"{name}.md").write_text(markdown)
    print(markdown)
    print(f"wrote {results / name}.json and .md")


def decoding_modes() -> dict:
    """The decoding blocks' modes, name -> (K, sampling): ``greedy`` chains at K = 4, ``auto`` (``--k auto``: each
    drafter's fastest shape on this machine), ``sampled`` at T 0.7 / top-p 0.9, K = 4."""
    from draftsmith.core.sampling import Sampling
    from draftsmith.eval.calibration import AUTO_K

    return {"greedy": (4, Sampling()), "auto": (AUTO_K, Sampling()), "sampled": (4, Sampling(0.7, 0.9))}


def score_block(verified: Target, references: dict, specs: dict, prompts, categories, n: int, mode: str) -> dict:
    """One interleaved decoding block of the drafters ``specs`` (name -> ``families.specs`` spec) in ``mode``
    (``decoding_modes``), plain decoding and, for greedy modes, the ``references`` beside them; as a report saves it,
    with the load average before and after."""
    from draftsmith.eval import blocks

    k, sampling = decoding_modes()[mode]
    refs = references if sampling.greedy else None  # the fastest-plain goals are greedy ones
    return blocks.score_block(verified, specs, prompts, k, sampling, n, categories, refs) | {"mode": mode}


def fmt(value: float | None, form: str = ".2f") -> str:
    """A table cell: ``value`` in ``form``, or "–" where it was not measured."""
    return "–" if value is None else format(value, form)


def gain_cell(base, row) -> str:
    """Δτ of ``row`` over ``base`` with its 95% paired-bootstrap interval between prompts and the prompts each way."""
    from draftsmith.decode.metrics import tau_gain

    if base is None or row.name == base.name or not (base.prompt_rounds and row.prompt_rounds):
        return "–"
    g = tau_gain(base.prompt_rounds, row.prompt_rounds)
    return f"{g.mean:+.2f} [{g.low:+.2f}, {g.high:+.2f}] ({g.better}↑ {g.worse}↓)"
