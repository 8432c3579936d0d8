"""``draftsmith quickstart --fast`` end to end: real target build, on-policy data, EAGLE training, scoring."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from draftsmith.cli import main
from draftsmith.export.registry import serving_format
from draftsmith.targets import default as default_target
from draftsmith.train.suite import PLANS


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
    for name, temperature in [("train", 1.0), ("val", 0.0), ("head", 0.0)]:
        meta = json.loads((run / "data" / name / "draftsmith.json").read_text())
        assert meta["status"] == "complete" and meta["settings"]["temperature"] == temperature
    for name in PLANS["demo"].drafters:
        saved = json.loads((run / "drafters" / name / "config.json").read_text())
        assert saved["method"] == name and saved["val_tau_est"] >= 1.0
    trained = [*PLANS["demo"].drafters, "draft_lm"]
    names = ["ngram", "sibling", *PLANS["demo"].drafters, "draft_lm", "eagle1-adaptive"]
    for k in (2, 4, 6):
        report = json.loads((run / "score" / f"k{k}" / "report.json").read_text())
        assert [r["name"] for r in report["drafters"]] == names
        assert all(r["greedy_exact"] == r["prompts"] for r in report["drafters"])
    # the fastest trained drafter, each at its fastest of the run's blocks (K = 2, 4, 6 and the K --k auto chose for
    # it), is exported in the format its family has; whether it beats plain decoding is said, and a slowdown is not
    # presented as the drafter to serve
    record = json.loads((run / "export" / "best.json").read_text())
    assert record["scores"] == [f"score/{b}/report.json" for b in ("k2", "k4", "k6", "auto")]
    rows = [r for block in record["scores"] for r in json.loads((run / block).read_text())["drafters"]]
    assert all(r["auto_k"]["k"] >= 1 for r in json.loads((run / "score/auto/report.json").read_text())["drafters"])
    best = max((r for r in rows if r["name"] in trained), key=lambda r: (r["speedup"], r["tau"]))
    assert record["name"] == best["name"] and record["speedup"] == best["speedup"]
    assert record["beats_plain"] == (best["speedup"] > 1.0)
    assert record["k"] == (best["auto_k"]["k"] if "auto_k" in best else best["k"])
    method = json.loads((run / "drafters" / best["name"] / "config.json").read_text())["method"]
    assert record["format"] == serving_format(method) or "refused" in record
    exported = run / "export" / best["name"]
    assert (exported / "config.json").is_file() and (exported / "model.safetensors").is_file()
    assert str(exported) in record["command"] or record["format"] == "native"
    pictures = ["acceptance.png", "speedup.png", "tau_vs_k.png", "training.png"]
    summary = json.loads((run / "report" / "report.json").read_text())
    assert sorted(summary["by_k"]) == ["2", "4", "6"] and len(summary["drafters"]) == len(names)
    assert all((run / "report" / name).read_bytes()[:4] == b"\x89PNG" for name in pictures)
    assert all(f"]({name})" in (run / "report" / "report.md").read_text() for name in pictures)
    md = (run / "report" / "report.md").read_text()
    assert md.splitlines()[2] == f"**{record['verdict']}**"  # it leads with what to serve, against the n-gram
    assert "ngram" in record["verdict"] or "n-gram" in record["verdict"]
    training = md.split("## Training")[1].split("##")[0]  # each fit's val τ_est: stopped rising, or still rising
    assert all(f"| {name} |" in training for name in PLANS["demo"].drafters)
    assert training.count("stopped rising") + training.count("still rising") >= len(PLANS["demo"].drafters)
    exported_section = (run / "report" / "report.md").read_text().split("## Exported for serving")[1]
    assert best["name"] in exported_section and (record["command"] in exported_section) == record["beats_plain"]
    # draftsmith report regenerates it from the saved scores and logs alone
    for path in (run / "report").iterdir():
        path.unlink()
    main(["report", str(run)])
    assert json.loads((run / "report" / "report.json").read_text()) == summary
    assert all((run / "report" / name).is_file() for name in pictures)
    # a second run reuses the cached target, the data, the trained drafters and the scores: each stage's manifest
    # records the inputs it was made from (one rule, core.manifest.is_current)
    reused = [
        "drafters/*/model.safetensors",
        "data/*/draftsmith.json",
        "score/k*/report.json",
        "drafters/*/manifest.json",
    ]
    stamps = {p: p.stat().st_mtime for p in [target_dir / "build.json", *(q for g in reused for q in run.glob(g))]}
    exports = len(PLANS["demo"].drafters) + 2  # and the draft LM and the acceptance head
    assert len(stamps) == 1 + 2 * exports + 3 + 3  # target, exports with manifests, data (train, val, head), scores
    main(["quickstart", "--fast", "--out", str(run)])
    assert {p: p.stat().st_mtime for p in stamps} == stamps
