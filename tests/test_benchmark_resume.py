"""A benchmark's scored block is computed once and saved whole, so an interrupted run resumes; a saved block of other
drafters is scored again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import saved, saved_block  # noqa: E402

from draftsmith.eval.rows import ScoreRow, to_dicts  # noqa: E402


def counted(result: dict):
    calls = []

    def run() -> dict:
        calls.append(1)
        return dict(result)

    return run, calls


def test_saved_computes_once_and_resumes_from_the_file(tmp_path):
    run, calls = counted({"step_ms": 40.0})
    path = tmp_path / "scores" / "r.json"
    assert saved(path, run) == {"step_ms": 40.0}
    assert saved(path, run) == {"step_ms": 40.0}
    assert len(calls) == 1
    assert json.loads(path.read_text()) == {"step_ms": 40.0}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no tmp sibling left


def test_saved_block_scores_again_for_other_drafters_and_stamps_the_commit(tmp_path):
    def block(names: list[str]) -> dict:
        rows = [ScoreRow(name, 4, 0.5, 2.0, 2.0, [0.5] * 4, [0.5] * 4, 10, 11, 40, 1.0, 40.0, 1.0, 0.1,
                         4.0, 1.0, 1.0, 4) for name in names]  # fmt: skip
        return {"k": 4, "drafters": to_dicts(rows)}

    path = tmp_path / "greedy.json"
    run, calls = counted(block(["ngram", "eagle3"]))
    first = saved_block(path, ["ngram", "eagle3"], run)
    assert set(first["measured"]) == {"git", "date"}
    assert saved_block(path, ["ngram", "eagle3"], run) == first
    assert len(calls) == 1
    other, other_calls = counted(block(["ngram", "eagle3", "eagle3_lk"]))
    again = saved_block(path, ["ngram", "eagle3", "eagle3_lk"], other)
    assert len(other_calls) == 1
    assert (
        [d["name"] for d in json.loads(path.read_text())["drafters"]]
        == ["ngram", "eagle3", "eagle3_lk"]
        == [d["name"] for d in again["drafters"]]
    )


def test_a_scored_block_holds_its_rows_the_load_before_and_after_and_its_mode(tmp_path):
    """``common.score_block`` over the package's ``eval.blocks.score_block`` (scaling's blocks too): the rows of the
    drafters named, plain decoding's, the load average before and after."""
    from common import score_block
    from conftest import make_llama, make_tokenizer

    from draftsmith.core.target import Target
    from draftsmith.families.specs import NGram

    make_llama(seed=0).save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")
    target = Target.from_pretrained(tmp_path / "target")
    block = score_block(target, {}, {"ngram": NGram()}, [[5, 6, 7, 5, 6]], None, 6, "greedy")
    assert [d["name"] for d in block["drafters"]] == ["ngram"] and block["plain"]["tokens"] > 0
    assert len(block["load"]) == 2 and block["mode"] == "greedy" and block["drafters"][0]["k"] == 4


def test_rasd_and_dspark_score_their_blocks_through_the_package(tmp_path, monkeypatch):
    """``rasd.score_block`` and ``dspark.score_block`` over ``eval.blocks.score_block``: dspark's drafters each at
    their own K; rasd's tree drafters built with their tree policy (a dynamic tree drafts more than a K-chain), the
    references beside greedy blocks only, and its mode."""
    import dspark
    import rasd
    from conftest import make_llama, make_tokenizer

    from draftsmith.core.target import Target
    from draftsmith.families.specs import Named, NGram, SelfDraft

    make_llama(seed=0).save_pretrained(tmp_path / "target")
    make_tokenizer().save_pretrained(tmp_path / "target")
    target = Target.from_pretrained(tmp_path / "target")
    prompts = [[5, 6, 7, 5, 6], [9, 10, 11, 9, 10, 11]]
    pairs = [(Named("ngram", NGram()), 4), (Named("self", SelfDraft()), 2)]
    block = dspark.score_block(target, pairs, prompts, None, 8)
    assert list(block) == ["plain", "drafters", "load"] and len(block["load"]) == 2
    assert [(d["name"], d["k"]) for d in block["drafters"]] == [("ngram", 4), ("self", 2)]

    monkeypatch.setattr(rasd, "AUTO_K", 4)  # --k auto times this machine; one K keeps the test fast and fixed
    specs = [(Named("self", SelfDraft()), rasd.CHAIN), (Named("self tree", SelfDraft()), rasd.DYNAMIC)]
    references = {"fast kernels": target}
    greedy = rasd.score_block(target, references, specs, prompts, None, 8, "greedy")
    assert list(greedy) == ["plain", "drafters", "load", "mode"] and greedy["mode"] == "greedy"
    chain, tree = greedy["drafters"]
    assert chain["mean_drafted"] <= 4 < tree["mean_drafted"]
    assert list(greedy["plain"]["references"]) == ["fast kernels"]
    sampled = rasd.score_block(target, references, specs, prompts, None, 8, "sampled")
    assert sampled["mode"] == "sampled" and not sampled["plain"].get("references")
