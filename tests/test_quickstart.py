"""``draftsmith quickstart --fast`` end to end: builds the default target for real and scores baselines."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from draftsmith import default_target
from draftsmith.cli import main


@pytest.mark.slow
def test_quickstart_fast_builds_target_and_scores_baselines(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    main(["quickstart", "--fast", "true", "--out", str(tmp_path / "run")])
    target_dir = default_target.default_target_dir(default_target.FAST)
    build = json.loads((target_dir / "build.json").read_text())
    assert build["target"]["heldout_ppl"] < build["unigram_heldout_ppl"]  # it learned something real
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    assert model.config.num_hidden_layers == default_target.FAST.target.layers
    report = json.loads((tmp_path / "run" / "score" / "report.json").read_text())
    names = [r["name"] for r in report["drafters"]]
    assert names == ["ngram", str(target_dir / "sibling")]
    assert all(r["greedy_exact"] == r["prompts"] for r in report["drafters"])
    # a second run reuses the cached target instead of rebuilding it
    mtime = (target_dir / "build.json").stat().st_mtime
    main(["quickstart", "--fast", "true", "--out", str(tmp_path / "run2")])
    assert (target_dir / "build.json").stat().st_mtime == mtime
