"""The recipe study's report (benchmarks/recipe.py): its goals lines judge one drafter, the study's winner, in every
set (a per-set pick would crown a drafter for a speed difference within the noise); each drafter's draft vocabulary's
coverage of the validation answers."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import draft_vocab_coverage  # noqa: E402
from recipe import BlockKey, base_row, goals, winner  # noqa: E402

from draftsmith.eval.rows import PlainRow, ScoreRow, block_dicts  # noqa: E402

ROW = ScoreRow("x", 4, 0.5, 2.0, 2.0, [0.5] * 4, [0.5] * 4, 10, 11, 40, 1.0, 40.0, 1.0, 0.1, 4.0, 1.0, 1.0, 4)


def block(speeds: dict[str, float], tau: dict[str, float]) -> dict:
    """A greedy block at plain 10 tokens/s: each drafter at its speed (n-gram 11)."""
    rows = [replace(ROW, name=n, tokens_per_s=s, speedup=s / 10, tau=tau.get(n, 1.5)) for n, s in speeds.items()]
    return block_dicts(PlainRow(400, 40.0, 10.0, 401), rows)


def test_goals_name_the_study_winner_in_every_set_even_where_another_row_was_faster():
    blocks = {  # "a" is faster over both sets (1.2 + 2.0 against 1.3 + 1.5); "b" is faster on MT-bench alone
        "mt-bench greedy": block({"a": 12.0, "b": 13.0, "ngram": 11.0}, {"a": 1.74, "b": 1.72}),
        "chat-heldout greedy": block({"a": 20.0, "b": 15.0, "ngram": 11.0}, {"a": 2.17, "b": 2.10}),
    }
    assert winner(blocks, ["a", "b"]) == "a"
    lines = goals({"blocks": blocks, "fits": {"a": {}, "b": {}}})
    assert [line.split(":")[0] for line in lines] == ["mt-bench", "chat-heldout"]
    assert lines[0].startswith("mt-bench: the winner a: τ 1.74 (goal ≥ 1.9)")
    assert lines[1].startswith("chat-heldout: the winner a: τ 2.17 (goal ≥ 2.3)")
    assert "1.09× the n-gram's speed" in lines[0] and "1.20× the fastest plain decoding" in lines[0]


def test_draft_vocab_coverage_counts_the_generated_tokens_the_draft_vocabulary_holds(tmp_path):
    import datasets
    import torch
    from safetensors.torch import save_file

    val = tmp_path / "val"
    rows = {"input_ids": [[1, 2, 3, 4], [2, 2, 5]], "loss_mask": [[0, 1, 1, 1], [0, 1, 1]]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(val))
    drafter = tmp_path / "d"
    drafter.mkdir()
    held = torch.zeros(8, dtype=torch.bool)
    held[[1, 2]] = True  # the prompt's tokens (1, and 2 of the second row) are not generated: not counted
    save_file({"t2d": held, "lm_head.weight": torch.zeros(2, 4)}, str(drafter / "model.safetensors"))
    assert draft_vocab_coverage(drafter, val) == 2 / 5  # generated: 2 3 4 | 2 5, of them held: the two 2s

    save_file({"lm_head.weight": torch.zeros(8, 4)}, str(drafter / "model.safetensors"))
    assert draft_vocab_coverage(drafter, val) is None  # drafts over the full vocabulary


def test_a_drafter_added_in_its_own_run_can_win_is_judged_in_its_own_block_and_gains_over_the_main_base():
    """``--add NAME``: NAME and the n-gram decoded in a block of their own. The winner may come from it, judged by its
    own block's figures; its Δτ pairs its prompts with the base's of the set's main block, where they did the same
    work (the same plain tokens), and nowhere else."""
    blocks = {
        "mt-bench greedy": block({"a": 12.0, "ngram": 11.0}, {"a": 1.74}),
        "chat-heldout greedy": block({"a": 20.0, "ngram": 11.0}, {"a": 2.17}),
        "mt-bench greedy +c": block({"c": 16.5, "ngram": 11.5}, {"c": 1.95}),
        "chat-heldout greedy +c": block({"c": 22.0, "ngram": 11.0}, {"c": 2.31}),
    }
    assert winner(blocks, ["a", "c"]) == "c"  # 1.65 + 2.2 against 1.2 + 2.0
    lines = goals({"blocks": blocks, "fits": {"a": {}, "c": {}}})
    assert [line.split(":")[0] for line in lines] == ["mt-bench", "chat-heldout"]
    assert lines[0].startswith("mt-bench: the winner c: τ 1.95 (goal ≥ 1.9)")
    assert "1.43× the n-gram's speed" in lines[0] and "1.65× the fastest plain decoding" in lines[0]  # 16.5 / 11.5
    assert lines[1].startswith("chat-heldout: the winner c: τ 2.31 (goal ≥ 2.3)")

    result = {"blocks": blocks, "base": "a"}
    assert base_row(result, "mt-bench greedy +c").tau == 1.74
    assert base_row(result, "chat-heldout greedy +c").tau == 2.17
    blocks["mt-bench greedy +c"]["plain"]["tokens"] += 1  # other work: no pairing
    assert base_row(result, "mt-bench greedy +c") is None


def test_block_keys_read_back_as_written_and_name_the_saved_files():
    out = Path("runs/recipe")
    for text, file in [("mt-bench greedy", "mt-bench-greedy.json"),
                       ("chat-heldout greedy +eagle3_31_16k-1M", "chat-heldout-greedy+eagle3_31_16k-1M.json")]:  # fmt: skip
        key = BlockKey.parse(text)
        assert str(key) == text and key.file(out) == out / file
    assert BlockKey.parse("mt-bench greedy +x") == ("mt-bench", "greedy", "x")
    assert BlockKey.parse("mt-bench sampled").added == ""


def test_a_new_workspace_adds_a_drafter_without_its_base_when_the_report_holds_the_blocks(
    tmp_path, monkeypatch, capsys
):
    """The report's JSON stands in for the blocks and fits a new workspace lost (``--out``, the study's drafters), when
    it measured the same work on this machine: adding NAME then needs NAME's drafter only. Checked before any target
    loads (a missing drafter is one line naming it)."""
    import json

    import pytest
    import recipe
    from common import machine

    from draftsmith.core.machine import native_bf16

    report = {
        "machine": machine(),
        "dtype": "bfloat16" if native_bf16()[0] else "float32",
        "prompts": 32,
        "max_new_tokens": 128,
        "base": "a",
        "fits": {"a": {"steps": 5}},
        "blocks": {
            "mt-bench greedy": block({"a": 12.0, "ngram": 11.0}, {"a": 1.74}),
            "chat-heldout greedy": block({"a": 20.0, "ngram": 11.0}, {"a": 2.17}),
        },
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    monkeypatch.setattr(recipe, "RESULTS", tmp_path)
    argv = ["recipe.py", "--study", str(tmp_path / "study"), "--drafters", "a", "--base", "a", "--add", "c"]
    argv += ["--out", str(tmp_path / "out"), "--modes", "greedy", "--results", "r"]

    def refused() -> str:
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit):
            recipe.main()
        return capsys.readouterr().err.splitlines()[-1]

    assert "no trained drafter c in" in refused()  # a's blocks come from the report
    assert not (tmp_path / "out").exists()  # refused before anything is written
    assert recipe.fit_records(tmp_path / "study", ["a", "c"], report["fits"]) == {"a": {"steps": 5}}

    from draftsmith.core.manifest import file_sha256

    def kept() -> dict:
        (tmp_path / "r.json").write_text(json.dumps(report))
        return recipe.earlier_result(tmp_path / "r.json", machine(), report["dtype"], 32, 128, tmp_path / "study")

    assert set(kept()["blocks"]) == {"mt-bench greedy", "chat-heldout greedy"}  # a: no longer in the study
    weights = tmp_path / "study" / "drafters" / "a" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"a trained again")
    assert kept()["blocks"] == {} and kept()["fits"] == {}  # no hash, no val τ_est in the study: another drafter
    report["fits"]["a"]["weights"] = file_sha256(weights)
    assert set(kept()["blocks"]) == {"mt-bench greedy", "chat-heldout greedy"}  # the same weights
    report["fits"]["a"]["weights"] = "0" * 64
    assert kept()["blocks"] == {} and kept()["fits"] == {}  # other weights: a's blocks are scored again
    weights.unlink()

    report["machine"]["cpu_flags"] = [*report["machine"]["cpu_flags"], "other"]  # another machine's speeds
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert "no trained drafter a, c in" in refused()


def test_the_report_names_its_drafters_data_budgets_in_order():
    from recipe import data_sizes

    assert data_sizes({"eagle3_31-1M": {}, "eagle3_31_ttt7-250k": {}, "eagle3-250k": {}}) == ["250k", "1M"]
    assert data_sizes({"eagle3_31-1M": {}}) == ["1M"]


def test_a_run_of_some_modes_keeps_the_reports_other_blocks_and_says_when_the_sampled_ones_lack_the_winner():
    """``--modes greedy`` with ``--add NAME``: the report's auto and sampled blocks stay as measured (not dropped),
    in the report's mode order; when NAME then wins, the report says the sampled blocks decoded the former winner."""
    from recipe import in_mode_order, other_modes, unsampled_winner

    earlier = {"blocks": {
        "mt-bench greedy": block({"a": 12.0, "ngram": 11.0}, {"a": 1.74}),
        "mt-bench auto": block({"a": 12.5, "ngram": 11.0}, {"a": 1.70}),
        "mt-bench sampled": block({"a": 11.0, "ngram": 10.5}, {"a": 1.60}),
    }}  # fmt: skip
    kept = other_modes(earlier, ["greedy"])
    assert list(kept) == ["mt-bench auto", "mt-bench sampled"]
    assert other_modes(earlier, ["greedy", "auto", "sampled"]) == {}
    scored = {"mt-bench greedy": earlier["blocks"]["mt-bench greedy"],
              "mt-bench greedy +c": block({"c": 16.5, "ngram": 11.5}, {"c": 1.95})}  # fmt: skip
    blocks = in_mode_order(scored | kept)
    assert list(blocks) == ["mt-bench greedy", "mt-bench greedy +c", "mt-bench auto", "mt-bench sampled"]

    note = unsampled_winner({"blocks": blocks, "fits": {"a": {}, "c": {}}})
    assert note.startswith("the sampled blocks decoded a (the winner when they were scored); the winner now, c,")
    blocks["mt-bench greedy +c"] = block({"c": 10.0, "ngram": 11.5}, {"c": 1.95})  # c slower: a still wins
    assert unsampled_winner({"blocks": blocks, "fits": {"a": {}, "c": {}}}) is None
    assert unsampled_winner({"blocks": scored, "fits": {"a": {}, "c": {}}}) is None  # no sampled block


def test_an_added_drafter_gets_greedy_and_auto_blocks_of_its_own_and_the_sampled_block_stays_the_main_ones():
    from argparse import Namespace

    from recipe import planned

    args = Namespace(drafters=["a", "b"], add=["c"], base="a", modes=["greedy", "auto", "sampled"])
    plan = [(str(key), names) for key, names in planned(args, ["mt-bench"], {}, ["a", "b", "c"])]
    assert plan == [
        ("mt-bench greedy", ["a", "b", "ngram"]),
        ("mt-bench greedy +c", ["c", "ngram"]),
        ("mt-bench auto", ["a", "b", "ngram"]),
        ("mt-bench auto +c", ["c", "ngram"]),
        ("mt-bench sampled", ["a", "b", "c", "ngram"]),  # no greedy block scored yet: every trained drafter
    ]
    scored = {"mt-bench greedy": block({"a": 12.0, "b": 13.0, "ngram": 11.0}, {})}
    assert planned(args, ["mt-bench"], scored, ["a", "b"], ["sampled"])[0][1] == ["a", "b", "ngram"]


def test_a_winner_joined_with_add_is_sampled_in_blocks_of_its_own_and_the_main_sampled_blocks_stay_as_measured():
    """The sampled mode decodes the winner; one joined with ``--add`` (``c``) gets its own sampled blocks beside the
    n-gram, and the main ones keep what they decoded (the base and the former winner ``b``), so sampling ``c`` does
    not need the base's drafter in the workspace; the report's note then knows ``c`` is sampled."""
    from argparse import Namespace

    from recipe import planned, unsampled_winner

    args = Namespace(drafters=["a", "b"], add=["c"], base="a", modes=["sampled"])
    greedy = {"mt-bench greedy": block({"a": 12.0, "b": 13.0, "ngram": 11.0}, {}),
              "mt-bench greedy +c": block({"c": 16.5, "ngram": 11.5}, {})}  # fmt: skip
    held = {"mt-bench sampled": block({"a": 11.0, "b": 12.0, "ngram": 10.5}, {})}
    plan = [(str(key), names) for key, names in planned(args, ["mt-bench"], greedy | held, ["a", "b", "c"])]
    assert plan == [("mt-bench sampled", ["a", "b", "ngram"]), ("mt-bench sampled +c", ["c", "ngram"])]
    plan = [(str(key), names) for key, names in planned(args, ["mt-bench"], greedy, ["a", "b", "c"])]
    assert plan == [("mt-bench sampled", ["a", "ngram"]), ("mt-bench sampled +c", ["c", "ngram"])]  # none held
    slower = greedy | {"mt-bench greedy +c": block({"c": 10.0, "ngram": 11.5}, {})}  # b wins: one main block
    assert [names for _, names in planned(args, ["mt-bench"], slower | held, ["a", "b", "c"])] == [["a", "b", "ngram"]]

    fits = {"a": {}, "b": {}, "c": {}}
    assert unsampled_winner({"blocks": greedy | held, "fits": fits}).endswith("beside the n-gram)")
    own = {"mt-bench sampled +c": block({"c": 15.0, "ngram": 10.5}, {})}
    assert unsampled_winner({"blocks": greedy | held | own, "fits": fits}) is None
