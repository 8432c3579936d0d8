"""``draftsmith quickstart --fast`` end to end: real target build, on-policy data, EAGLE training, scoring."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from draftsmith import default_target
from draftsmith.cli import main
from draftsmith.quickstart import QUICKSTART_DRAFTERS


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
    for name in QUICKSTART_DRAFTERS:
        exported = json.loads((run / "drafters" / name / "config.json").read_text())
        assert exported["method"] == name and exported["val_tau_est"] >= 1.0
    names = ["ngram", "sibling", *QUICKSTART_DRAFTERS, "draft_lm", "eagle1-adaptive"]
    for k in (2, 4, 6):
        report = json.loads((run / "score" / f"k{k}" / "report.json").read_text())
        assert [r["name"] for r in report["drafters"]] == names
        assert all(r["greedy_exact"] == r["prompts"] for r in report["drafters"])
    pictures = ["acceptance.png", "speedup.png", "tau_vs_k.png", "training.png"]
    summary = json.loads((run / "report" / "report.json").read_text())
    assert sorted(summary["by_k"]) == ["2", "4", "6"] and len(summary["drafters"]) == len(names)
    assert all((run / "report" / name).read_bytes()[:4] == b"\x89PNG" for name in pictures)
    assert all(f"]({name})" in (run / "report" / "report.md").read_text() for name in pictures)
    # draftsmith report regenerates it from the saved scores and logs alone
    for path in (run / "report").iterdir():
        path.unlink()
    main(["report", str(run)])
    assert json.loads((run / "report" / "report.json").read_text()) == summary
    assert all((run / "report" / name).is_file() for name in pictures)
    # a second run reuses the cached target, the data and the trained drafters
    stamps = {p: p.stat().st_mtime for p in [target_dir / "build.json", *run.glob("drafters/*/model.safetensors")]}
    main(["quickstart", "--fast", "--out", str(run)])
    assert {p: p.stat().st_mtime for p in stamps} == stamps
