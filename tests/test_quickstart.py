"""``draftsmith quickstart --fast`` end to end: real target build, on-policy data, EAGLE training, scoring."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from draftsmith import default_target
from draftsmith.cli import main


@pytest.mark.slow
def test_quickstart_fast_runs_every_stage_and_reuses_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "home"))
    main(["quickstart", "--fast", "true", "--out", str(tmp_path / "run")])
    target_dir = default_target.default_target_dir(default_target.FAST)
    build = json.loads((target_dir / "build.json").read_text())
    assert build["target"]["heldout_ppl"] < build["unigram_heldout_ppl"]  # it learned something real
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    assert model.config.num_hidden_layers == default_target.FAST.target.layers
    run = tmp_path / "run"
    for name in ("train", "val"):
        assert json.loads((run / "data" / name / "draftsmith.json").read_text())["status"] == "complete"
    for name in ("eagle3", "eagle1"):
        exported = json.loads((run / "drafters" / name / "config.json").read_text())
        assert exported["method"] == name and exported["val_tau_est"] >= 1.0
    report = json.loads((run / "score" / "report.json").read_text())
    names = [r["name"] for r in report["drafters"]]
    assert names == ["ngram", "sibling", "eagle3", "eagle1"]
    assert all(r["greedy_exact"] == r["prompts"] for r in report["drafters"])
    # a second run reuses the cached target, the data and the trained drafters
    stamps = {p: p.stat().st_mtime for p in [target_dir / "build.json", *run.glob("drafters/*/model.safetensors")]}
    main(["quickstart", "--fast", "--out", str(run)])
    assert {p: p.stat().st_mtime for p in stamps} == stamps
