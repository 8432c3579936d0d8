"""``benchmarks/served.py``: drafters served by vLLM against vLLM without speculation. The fast tests check its
arguments, its cells (saved whole, reused only for the same inputs), its figures and its table; the ``engine`` test
serves a tiny target with vLLM's n-gram through ``--quick`` and reruns it from the saved cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import served  # noqa: E402
import served_report  # noqa: E402


def run_served(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/served.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batches", "1,0"], "--batches must be positive, got 0"),
        (["--batches", "one"], "--batches: expected comma-separated positive integers, got 'one'"),
        (["--drafter", "mine=runs/no-such-drafter.ckpt"], "--drafter mine: no such path runs/no-such-drafter.ckpt"),
        (["--drafter", "self=target"], "--drafter self=target: vLLM serves trained drafters, draft LMs and the n-gram"),
        (["--drafter", "plain=ngram:2"], "--drafter: names must be distinct and not 'plain', got plain"),
        (["--sets", "nosuch.jsonl"], "--sets nosuch.jsonl: no such prompt file (or builtin:NAME)"),
        (["--score", "humaneval=README.md"], "--score humaneval=README.md: expected SET=FILE.json[#BLOCK], SET one of"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_before_anything_runs(tmp_path, args, message):
    run = run_served("--out", str(tmp_path / "work"), "--results", str(tmp_path / "results"), *args)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"served.py: error: {message}")
    assert not any(tmp_path.iterdir())


def test_quick_is_one_drafter_one_set_batch_one_two_prompts_of_eight_tokens():
    args = served.parse_args(["--quick", "--drafter", "ngram:5"])
    assert (args.prompts, args.new_tokens, args.batches, args.eager) == (2, 8, [1], True)
    assert [d.name for d in args.drafters] == ["ngram:5"] and list(args.sets) == ["mt-bench"]
    full = served.parse_args(["--batches", "16,1,4"])
    assert full.batches == [1, 4, 16] and list(full.sets) == ["mt-bench", "chat-heldout"]
    assert [d.name for d in full.drafters] == ["ngram"] and full.drafters[0].spec.max_ngram == 3  # always served


def test_a_cell_is_reused_only_for_the_same_inputs_and_is_never_half_written(tmp_path):
    key = {"drafter": "ngram", "set": "mt-bench", "batch": 4, "prompts": "abc"}
    path = served.cell_path(tmp_path, "ngram", "mt-bench", 4)
    assert served.load_cell(path, key) is None
    served.save_cell(path, {"key": key, "chunks": []})
    assert served.load_cell(path, key) == {"key": key, "chunks": []}
    assert served.load_cell(path, key | {"prompts": "abd"}) is None  # other prompts: measured again
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    path.write_text('{"key": ')  # a file cut short is no cell
    assert served.load_cell(path, key) is None


def test_a_reports_cells_stand_in_for_lost_ones_only_for_the_same_machine_inputs_drafter_and_prompts(
    tmp_path, monkeypatch
):
    from common import machine

    here, ngram = machine(), {"method": "ngram", "k": 4}
    cell = {"drafter": "ngram", "set": "mt-bench", "batch": 1, "vllm": "0.32.0", "chunks": [{"same": 1}],
            "summary": {"counters": {"num_drafts": 3}}}  # fmt: skip
    report = {"machine": here, "target": {"tokenizer_hash": "t"}, "dtype": "float32", "vllm": "0.32.0",
              "args": {"k": 4, "prompts": 32}, "drafters": {"ngram": ngram}, "sets": {"mt-bench": "builtin:mt-bench"},
              "cells": [cell, {"drafter": "ngram", "set": "mt-bench", "batch": 4, "error": "failed"}]}  # fmt: skip
    path = tmp_path / "served.json"
    path.write_text(json.dumps(report))
    inputs, sets = {"target": {"tokenizer_hash": "t"}, "dtype": "float32", "vllm": "0.32.0"}, dict(report["sets"])

    def kept(**change) -> dict:
        given = {"inputs": inputs, "drafters": {"ngram": ngram}, "sets": sets, "args": {"k": 4, "prompts": 32}} | change
        result = served.earlier_report(path, here, given["inputs"], given["args"])
        return served.earlier_cells(result, given["drafters"], given["sets"])

    assert kept() == {("ngram", "mt-bench", 1): {
        "key": None, "vllm": "0.32.0", "chunks": [{"same": 1}], "counters": {"num_drafts": 3},
        "measured": None}}  # a failed cell is measured again; the report's run reused this one: unrecorded  # fmt: skip
    path.write_text(json.dumps(report | {"computed": ["ngram__mt-bench__b1.json"]}))
    assert kept()[("ngram", "mt-bench", 1)]["measured"] == {"git": here["git"], "date": here["date"]}  # its run's
    path.write_text(json.dumps(report))
    assert kept(inputs=inputs | {"dtype": "bfloat16"}) == {}
    assert kept(inputs=inputs | {"target": {"tokenizer_hash": "u"}}) == {}
    # a report whose target recorded its config hash with the transformers version in it: kept for that config only
    import draftsmith.core.fingerprint as core_fingerprint

    monkeypatch.setitem(core_fingerprint.LEGACY_CONFIG_HASHES, "new", frozenset({"old"}))
    path.write_text(json.dumps(report | {"target": {"tokenizer_hash": "t", "config_hash": "old"}}))
    assert len(kept(inputs=inputs | {"target": {"tokenizer_hash": "t", "config_hash": "new"}})) == 1
    assert kept(inputs=inputs | {"target": {"tokenizer_hash": "t", "config_hash": "other"}}) == {}
    path.write_text(json.dumps(report))
    assert kept(args={"k": 3, "prompts": 32}) == {}
    assert kept(drafters={"ngram": ngram | {"k": 3}}) == {}
    assert kept(sets={"mt-bench": "other.jsonl"}) == {}
    report["machine"] = here | {"cpu_flags": ["other"]}
    path.write_text(json.dumps(report))
    assert kept() == {}
    assert served.earlier_report(tmp_path / "none.json", here, inputs, {}) is None
    assert served.earlier_cells(None, {}, sets) == {}


def test_a_run_keeps_the_earlier_reports_other_drafters_with_their_cells_and_scores(tmp_path):
    from common import machine

    here, ngram, eagle3 = machine(), {"method": "ngram", "k": 4}, {"method": "eagle3", "k": 4}
    cells = [{"drafter": d, "set": s, "batch": 1, "vllm": "0.32.0", "chunks": [{"same": 1}], "summary": {}}
             for d in ("ngram", "eagle3") for s in ("mt-bench", "chat-heldout")]  # fmt: skip
    scores = {s: {"ngram": {"tau": 1.4}, "eagle3": {"tau": 1.5}} for s in ("mt-bench", "chat-heldout")}
    report = {"machine": here, "dtype": "float32", "args": {"k": 4}, "drafters": {"ngram": ngram, "eagle3": eagle3},
              "sets": {"mt-bench": "builtin:mt-bench", "chat-heldout": "builtin:chat-heldout"}, "scores": scores,
              "cells": cells + [{"drafter": "dflash", "set": "mt-bench", "batch": 1, "error": "failed"}]}  # fmt: skip
    path = tmp_path / "served.json"
    path.write_text(json.dumps(report))
    sets, inputs = {"mt-bench": "builtin:mt-bench"}, {"dtype": "float32"}
    earlier = served.earlier_report(path, here, inputs, {"k": 4})
    drafters, kept, kept_scores = served.other_drafters(earlier, {"ngram": ngram}, sets)
    assert drafters == {"eagle3": eagle3}  # named here: not kept; failed only (dflash): measured again, not kept
    assert kept == [cells[2] | {"measured": None}]  # its cells on this run's sets only; measured by an unrecorded run
    assert kept_scores == {"mt-bench": {"ngram": {"tau": 1.4}, "eagle3": {"tau": 1.5}}}  # ngram: the same config
    _, _, kept_scores = served.other_drafters(earlier, {"ngram": ngram | {"k": 3}}, sets)
    assert kept_scores == {"mt-bench": {"eagle3": {"tau": 1.5}}}  # a changed ngram: its earlier score is not its own
    assert served.earlier_report(path, here, inputs, {"k": 3}) is None  # other K: nothing kept
    assert served.other_drafters(None, {}, sets) == ({}, [], {})
    assert served.other_drafters(earlier, {}, {"mt-bench": "my.jsonl"}) == ({}, [], {})  # other prompts
    md = served_report.markdown(result({1: 1.5}, tau=2.0) | {"kept": ["dflash", "eagle3"]})
    assert "Kept from this report's earlier run, as measured (drafters this run did not name): dflash, eagle3." in md


def chunk(plain: tuple[float, list[int]], drafter: tuple[float, list[int]], same: int) -> dict:
    """A cell's chunk: each side's seconds and row lengths, every row at 10 ms per token after its first."""
    return {
        who: {"seconds": s, "tokens": n, "token_seconds": [0.01 * (t - 1) for t in n]}
        for who, (s, n) in (("plain", plain), ("drafter", drafter))
    } | {"same": same}


def test_a_cells_figures_are_its_tokens_over_its_seconds_and_vllms_counters():
    cell = {
        "chunks": [chunk((2.0, [100]), (1.0, [100]), 1), chunk((2.0, [60]), (1.5, [60]), 0)],
        "counters": {"num_drafts": 40, "num_draft_tokens": 160, "num_accepted_tokens": 80},
    }
    s = served_report.summary(cell)
    assert s["plain"]["tokens_per_s"] == pytest.approx(160 / 4.0)
    assert s["drafter"]["tokens_per_s"] == pytest.approx(160 / 2.5)
    assert s["speedup"] == pytest.approx(4.0 / 2.5)
    assert s["drafter"]["tpot_ms"] == pytest.approx(10.0)
    assert (s["mean_acceptance_length"], s["alpha"], s["same"], s["rows"]) == (3.0, 0.5, 1, 2)


def result(speedups: dict[int, float], tau: float | None) -> dict:
    """A served result with one drafter whose speedup at each batch is given (plain at 100 tokens/s)."""
    from common import machine

    cells = []
    for b, x in speedups.items():
        cell = {"chunks": [chunk((1.0, [100]), (1.0 / x, [100]), 1)],
                "counters": {"num_drafts": 25, "num_draft_tokens": 100, "num_accepted_tokens": 50}}  # fmt: skip
        cells.append({"drafter": "eagle3", "set": "chat-heldout", "batch": b, "summary": served_report.summary(cell),
                      "chunks": cell["chunks"], "vllm": "0.32.0"})  # fmt: skip
    cells.append({"drafter": "eagle1", "set": "chat-heldout", "batch": 1, "error": "vLLM stopped (exit 1)"})
    scores = {"chat-heldout": {"eagle3": {"tau": tau, "k": 4, "prompts": 32, "tokens": 4096}}} if tau else {}
    return {
        "machine": machine(), "load": [1.0, 2.0], "vllm": "0.32.0", "target_name": "smollm2", "dtype": "bfloat16",
        "dtype_why": "the CPU has avx512_bf16", "eager": False, "batches": sorted(speedups),
        "sets": {"chat-heldout": "builtin:chat-heldout"}, "scores": scores,
        "drafters": {"eagle3": {"k": 4}, "eagle1": {"k": 4, "note": "serves its own target X"}},
        "args": {"k": 4, "prompts": 32, "new_tokens": 128}, "cells": cells,
    }  # fmt: skip


def test_the_table_shows_the_batch_where_speculation_stops_paying_and_the_acceptance_gap():
    md = served_report.markdown(result({1: 1.5, 4: 1.1, 16: 0.8}, tau=2.06))
    row = next(line for line in md.splitlines() if line.startswith("| eagle3 (4) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:10] == ["150.0", "1.50×", "10.0", "110.0", "1.10×", "10.0", "80.0", "**0.80×**", "10.0"]
    # stops paying at 16; vLLM's mean acceptance length 1 + 150 / 75 = 3.00 counts the 75 drafting steps only; over
    # all 297 - 150 = 147 steps after the rows' first tokens, τ = 297 / 147 = 2.02, against the verifier's 2.06: 1.9%
    assert cells[10:15] == ["b=16", "3.00", "2.02", "2.06 (K=4, 32 × 4096)", "1.9%"] and cells[15] == "3/3"
    plain = next(line for line in md.splitlines() if line.startswith("| plain |"))
    assert "| 100.0 | 1.00× | 10.0 |" in plain
    assert (
        "| eagle1 (4) | failed | – | – | – | – | – |" in md and "eagle1, chat-heldout, b=1: failed: vLLM stopped" in md
    )
    assert "serves its own target X" in md and "bfloat16: the CPU has avx512_bf16" in md
    assert "This run measured 0 of the 3 cells; the others were reused" in md  # cells of an earlier run
    always = served_report.markdown(result({1: 1.2, 4: 1.0}, tau=None))
    row = next(line for line in always.splitlines() if line.startswith("| eagle3 (4) |"))
    assert "| – | 3.00 | 2.02 | – | – |" in row  # pays at every batch; no score named: no verifier τ


def test_the_verifiers_tau_is_read_from_a_score_block_by_drafter_name():
    from draftsmith.eval.rows import read_rows

    title = "chat-heldout, greedy, K = 2"
    scores = served.read_scores([("chat-heldout", f"benchmarks/results/real_target_bf16.json#{title}")])
    rows = read_rows(
        json.loads((ROOT / "benchmarks/results/real_target_bf16.json").read_text())["blocks"][title]["drafters"]
    )
    assert {name: s["tau"] for name, s in scores["chat-heldout"].items()} == {r.name: r.tau for r in rows}
    with pytest.raises(SystemExit, match="has no block 'nosuch'"):
        served.read_scores([("chat-heldout", "benchmarks/results/real_target_bf16.json#nosuch")])


@pytest.mark.slow
@pytest.mark.engine
def test_quick_serves_a_tiny_target_with_vllms_ngram_and_a_rerun_reuses_its_cells(tmp_path, monkeypatch):
    from conftest import make_tokenizer
    from test_export_vllm import make_target

    from engines import vllm_check

    python, why = vllm_check.ensure_venv(ROOT / ".venv-vllm")
    if python is None:
        pytest.skip(why)
    make_target().save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")
    # repeated words: prompt lookup has n-grams to draft from
    (tmp_path / "tiny.jsonl").write_text(
        "".join(json.dumps({"prompt": "w3 w4 w5 w3 w4 w5 w3 w4"}) + "\n" for _ in range(3))
    )
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    args = ["--quick", "--target", str(tmp_path / "target"), "--sets", str(tmp_path / "tiny.jsonl"), "--dtype",
            "float32", "--out", str(tmp_path / "work"), "--results", str(tmp_path / "results"), "--name", "q",
            "--vllm-python", str(python)]  # fmt: skip
    served.main(args)
    first = json.loads((tmp_path / "results" / "q.json").read_text())
    (cell,) = first["cells"]
    assert "error" not in cell, cell
    assert (cell["drafter"], cell["set"], cell["batch"], first["dtype"]) == ("ngram", "tiny", 1, "float32")
    s = cell["summary"]
    assert s["rows"] == 2 and s["plain"]["tokens"] == s["drafter"]["tokens"] == 16  # no EOS in this target
    assert s["same"] == 2  # float32: vLLM's speculative greedy output is its plain output
    assert s["counters"]["num_drafts"] > 0 and s["drafter"]["tpot_ms"] is not None
    assert first["computed"] == ["ngram__tiny__b1.json"]
    served.main(args)  # everything saved: no engine starts, the same figures
    second = json.loads((tmp_path / "results" / "q.json").read_text())
    assert second["computed"] == [] and second["cells"] == first["cells"]
    for saved in (tmp_path / "work" / "cells").iterdir():  # a new workspace: the report's cells stand in
        saved.unlink()
    served.main(args)
    third = json.loads((tmp_path / "results" / "q.json").read_text())
    assert third["computed"] == [] and third["cells"] == first["cells"]
    assert (tmp_path / "results" / "q.md").read_text().count("| ngram (4) |") == 1
