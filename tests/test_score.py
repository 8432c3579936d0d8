"""``draftsmith score`` end to end on saved tiny models: reports, metrics and exactness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_llama

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.errors import DraftsmithError
from draftsmith.eval.rows import PlainRow
from draftsmith.eval.score import score_drafters
from draftsmith.layers.causal_lm import DraftLM


def test_score_cli_writes_report_with_greedy_exactness(model_dirs, prompt_file, tmp_path, capsys):
    out = tmp_path / "score"
    main(
        [
            "score",
            "--target",
            str(model_dirs["target"]),
            "--drafter",
            f"[ngram,target,{model_dirs['drafter']}]",
            "--prompts",
            str(prompt_file),
            "-k",
            "3",
            "--max-new-tokens",
            "16",
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().count("\n| ") == 5  # header, rule, plain, three drafters
    rows = {r["name"]: r for r in report["drafters"]}
    assert set(rows) == {"ngram", "target", str(model_dirs["drafter"])}
    for row in rows.values():
        assert row["greedy_exact"] == 2  # both prompts reproduce plain greedy decoding
        assert 0 <= row["alpha"] <= 1 and 1 <= row["tau"] <= 4
        assert len(row["accept_at"]) == 3
        assert row["accept_at"] == sorted(row["accept_at"], reverse=True)
    assert rows["target"]["alpha"] == 1.0
    assert report["target"]["vocab_size"] == 96
    assert "| plain decoding |" in capsys.readouterr().out


def test_metrics_count_tokens_and_calls_consistently(target, tokenizer, prompts):
    plain, rows = score_drafters(
        target, {"self": DraftLM(target.model, tokenizer)}, prompts, 3, Sampling(), 13, progress=False
    )
    row = rows[0]
    # 13 tokens = 1 from prefill + 3 rounds of 4: tau = 4, alpha = 1
    assert row.tau == pytest.approx(4.0) and row.alpha == 1.0
    assert row.rounds == 3 * len(prompts) and row.target_calls == 4 * len(prompts)
    assert row.tokens == plain.tokens == 13 * len(prompts)
    assert plain.target_calls == 13 * len(prompts)
    assert row.accept_given_reached == [1.0, 1.0, 1.0]
    assert row.prompt_rounds == [(9, 3)] * len(prompts)  # per prompt: 3 rounds of 3 accepted drafts


def test_tau_gain_tells_a_gain_on_every_prompt_from_the_spread_between_prompts():
    from draftsmith.decode.metrics import tau_gain

    base = [(a, 10) for a in (2, 8, 4, 12, 6, 10, 3, 9)]  # τ 1.2 to 2.2: prompts differ a lot
    lifted = [(a + 2, r) for a, r in base]  # +0.2 τ on every prompt
    gain = tau_gain(base, lifted)
    assert gain.mean == pytest.approx(0.2) and gain.low == pytest.approx(0.2) and gain.high == pytest.approx(0.2)
    assert gain.significant and (gain.better, gain.worse, gain.prompts) == (8, 0, 8)
    shuffled = tau_gain(base, base[1:] + base[:1])  # the same τs on other prompts: mean 0, wide, no gain
    assert shuffled.mean == pytest.approx(0.0) and shuffled.low < -0.1 < 0.1 < shuffled.high
    assert not shuffled.significant and shuffled.better == shuffled.worse == 4
    noisy = tau_gain(base, [(a + (6 if i == 0 else 0), r) for i, (a, r) in enumerate(base)])  # one prompt alone
    assert noisy.mean == pytest.approx(0.075) and noisy.low == 0.0 and not noisy.significant
    with pytest.raises(ValueError, match="the same prompts"):
        tau_gain(base, lifted[:-1])


def test_one_k_per_drafter_in_one_run(target, tokenizer, prompts):
    self_draft = DraftLM(target.model, tokenizer)  # every token accepted: tau = K + 1 exactly
    _, rows = score_drafters(
        target, {"k2": self_draft, "k4": self_draft}, prompts, {"k2": 2, "k4": 4}, Sampling(), 16, progress=False
    )
    by = {r.name: r for r in rows}
    assert (by["k2"].k, by["k4"].k) == (2, 4)
    assert by["k2"].tau == pytest.approx(3.0) and by["k4"].tau == pytest.approx(5.0)  # 16 = 1 + 5·3 = 1 + 3·5
    with pytest.raises(DraftsmithError, match=r"K given for \['k2'\], drafters are \['k2', 'k4'\]"):
        score_drafters(target, {"k2": self_draft, "k4": self_draft}, prompts, {"k2": 2}, Sampling(), 4, progress=False)


def test_sampling_scores_report_no_greedy_exactness(target, tokenizer, prompts):
    _, rows = score_drafters(
        target, {"self": DraftLM(target.model, tokenizer)}, prompts, 2, Sampling(1.0), 9, progress=False
    )
    # a drafter identical to the target is always accepted under sampling too (p == q)
    assert rows[0].greedy_exact is None and rows[0].alpha == 1.0


def test_ideal_speedup_costs_verification_at_the_measured_ratio(target, tokenizer, prompts):
    drafter = DraftLM(target.model, tokenizer)  # drafts what the target says: every token accepted
    _, rows = score_drafters(target, {"self": drafter}, prompts, 3, Sampling(0.0), 8, progress=False)
    row = rows[0]
    assert row.verify_ratio > 0 and row.verify_ratio != 1.0  # measured, not assumed
    expected = row.tau / (row.verify_ratio + row.mean_drafted * row.cost_ratio)
    assert row.ideal_speedup == pytest.approx(expected)


def test_verify_ratio_interpolates_between_measured_token_counts():
    from draftsmith.decode.metrics import interpolate_ratio

    ratios = {1: 1.0, 5: 2.0, 17: 2.6}
    assert interpolate_ratio(ratios, 3) == pytest.approx(1.5)
    assert interpolate_ratio(ratios, 11) == pytest.approx(2.3)
    assert interpolate_ratio(ratios, 40) == 2.6 and interpolate_ratio(ratios, 0.5) == 1.0


def test_score_rows_serialise_to_the_saved_dicts_and_read_back():
    """Every score row the benchmarks saved reads back as a ``ScoreRow`` and serialises to the same dict (reports
    saved before a field existed included), so typed rows leave the saved format as it was."""
    from draftsmith.eval.rows import ScoreRow

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    saved = []

    def collect(node):
        if isinstance(node, dict):
            rows = node.get("drafters")
            if isinstance(rows, list) and rows and isinstance(rows[0], dict) and "tau" in rows[0]:
                saved.extend(rows)
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for path in sorted(root.glob("*.json")):
        collect(json.loads(path.read_text()))
    assert len(saved) > 100
    for d in saved:
        row = ScoreRow.from_dict(d)
        assert row.to_dict() == d
        assert row.name == d["name"] and row.tau == d["tau"]
        assert row.auto_k is None or row.auto_k.k == d["auto_k"]["k"]


def test_a_live_row_serialises_as_before(target, tokenizer, prompts):
    from draftsmith.eval.rows import ScoreRow

    plain, rows = score_drafters(
        target, {"self": DraftLM(target.model, tokenizer)}, prompts, 2, Sampling(0.0), 6, progress=False
    )
    saved = rows[0].to_dict()
    assert list(saved)[:3] == ["name", "k", "alpha"] and saved["prompts"] == len(prompts)
    assert not {"auto_k", "lossy", "verify", "target", "checked", "divergences"} & set(saved)  # only where set
    assert json.loads(json.dumps(saved)) == saved and ScoreRow.from_dict(saved) == rows[0]
    assert set(plain.to_dict()) == {"tokens", "seconds", "tokens_per_s", "target_calls"}


def test_reference_targets_decode_plainly_in_the_same_run_and_the_fastest_is_named(target, tokenizer, prompts):
    other = Target(make_llama(seed=5), tokenizer, feature_layers=(1, 2), name="other")
    plain, rows = score_drafters(
        target, {"self": DraftLM(target.model, tokenizer)}, prompts, 2, Sampling(0.0), 6, progress=False,
        references={"other": other},
    )  # fmt: skip
    ref = plain.references["other"]
    assert ref.tokens == plain.tokens == 6 * len(prompts) and ref.target_calls == 6 * len(prompts)
    assert ref.tokens_per_s != plain.tokens_per_s  # its own decodes, timed apart
    assert plain.fastest is max(plain, ref, key=lambda m: m.tokens_per_s)
    assert rows[0].speedup == pytest.approx(rows[0].tokens_per_s / plain.tokens_per_s, rel=1e-3)  # still own plain
    saved = json.loads(json.dumps(plain.to_dict()))
    assert set(saved["references"]) == {"other"} and PlainRow.from_dict(saved) == plain


@pytest.mark.parametrize(("flag", "value"), [("--tree", "bushy"), ("--verify", "spectre")], ids=["tree", "verify"])
def test_an_unknown_tree_or_rule_stops_in_one_line_naming_its_flag(
    model_dirs, prompt_file, tmp_path, capsys, flag, value
):
    with pytest.raises(SystemExit):
        main(["score", "--target", str(model_dirs["target"]), "--drafter", "ngram", "--prompts", str(prompt_file),
              flag, value, "--out", str(tmp_path / "s")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"draftsmith: error: {flag} must be one of") and repr(value) in err[0]


def test_report_regenerates_tables_and_plots_from_saved_score_reports(tmp_path):
    """``draftsmith report`` reads saved reports' rows back as typed rows (the quickstart's committed blocks, at every
    K and ``--k auto``), and its report.json saves them as they were."""
    from draftsmith.eval.compare import report

    saved = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/quickstart.json").read_text())
    run = tmp_path / "run"
    for name, block in saved["blocks"].items():
        (run / "score" / name).mkdir(parents=True)
        (run / "score" / name / "report.json").write_text(json.dumps(block))
    out = report([run], k=4)
    summary = json.loads((out / "report.json").read_text())
    assert summary["drafters"] == saved["blocks"]["k4"]["drafters"]
    assert summary["plain"] == saved["blocks"]["k4"]["plain"]
    md = (out / "report.md").read_text()
    assert "## K chosen per drafter (--k auto)" in md and "| plain decoding |" in md
    assert all((out / png).is_file() for png in ("acceptance.png", "speedup.png", "tau_vs_k.png"))


def test_k_auto_profiles_acceptance_on_the_first_held_out_prompts_not_one(target, monkeypatch):
    """``--k auto``'s acceptance profile (for a drafter without a recorded one) comes from decodes of the first
    ``CALIBRATION_PROMPTS`` prompts: one prompt whose drafts were all accepted sent the quickstart's draft LM to K = 8
    (τ 9.00 predicted there, 2.51 measured over ten prompts)."""
    from draftsmith.decode.verifier import SpeculativeDecoder
    from draftsmith.eval import calibration

    calibrated, generate = [], SpeculativeDecoder.generate

    def recording(self, prompt, max_new_tokens, generator=None):
        if self.k == calibration.AUTO_MAX_K:
            calibrated.append(list(prompt))
        return generate(self, prompt, max_new_tokens, generator)

    monkeypatch.setattr(SpeculativeDecoder, "generate", recording)
    prompts = [[3, 4, 5, 6], [7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18]]
    drafter = DraftLM(make_llama(seed=5, layers=1))
    _, [row] = score_drafters(target, {"lm": drafter}, prompts, "auto", Sampling(), 8, progress=False)
    assert calibrated[: calibration.CALIBRATION_PROMPTS] == prompts[: calibration.CALIBRATION_PROMPTS] == prompts[:3]
    assert row.auto_k.source == "calibration"
