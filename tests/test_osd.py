"""Online speculative decoding: the draft LM learns from its rejections while decoding, output stays exact."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import VOCAB, make_llama

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling
from draftsmith.decode.metrics import prompt_windows
from draftsmith.decode.verifier import DecodeResult
from draftsmith.eval.score import score_drafters
from draftsmith.families.online.drafter import OnlineConfig, OnlineDrafter
from draftsmith.layers.causal_lm import DraftLM

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_online_adaptation_updates_weights_and_raises_acceptance_on_recurring_text(target, tokenizer):
    model = make_llama(seed=3, layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = OnlineConfig(lr=3e-3, update_every=8, steps=4, windows=4)
    online = OnlineDrafter(DraftLM(model, tokenizer), target, cfg)
    g = torch.Generator().manual_seed(5)
    texts = [torch.randint(0, VOCAB - 2, (6,), generator=g).tolist() for _ in range(3)]
    prompts = texts * 4  # held-out text that keeps coming back: what OSD adapts to
    frozen = DraftLM(make_llama(seed=3, layers=1), tokenizer)
    _, rows = score_drafters(target, {"osd": online, "frozen": frozen}, prompts, 4, Sampling(0.0), 24, progress=False)
    osd, still = rows
    assert osd.greedy_exact == still.greedy_exact == len(prompts)  # learning never changes the output
    report = osd.extra["online"]
    assert report["updates"] >= 3 and report["rejections"] >= 3 * cfg.update_every
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    first, last = report["windows"][0], report["windows"][-1]
    assert [first["prompts"], last["prompts"]] == [[0, 3], [9, 12]]
    assert last["alpha"] > first["alpha"] + 0.2 and last["tau"] > first["tau"]
    assert report["kl_last_update"] < report["kl_first_update"]
    assert osd.alpha > still.alpha and "online" not in still.extra


def test_windows_split_prompts_in_order_and_pool_rounds():
    results = [DecodeResult([0], accepted=[a], drafted=[4]) for a in (0, 1, 2, 4, 4)]
    w = prompt_windows(results, 2)
    assert [x["prompts"] for x in w] == [[0, 2], [2, 5]]
    assert w[0]["alpha"] == pytest.approx(1 / 8) and w[1]["alpha"] == pytest.approx(10 / 12)
    assert w[1]["tau"] == pytest.approx((10 + 3) / 3)


@pytest.mark.slow
def test_score_online_adapt_reports_windows(model_dirs, prompt_file, tmp_path):
    main(["score", f"--target={model_dirs['target']}", "--drafter", f"lm={model_dirs['drafter']}", "--online-adapt",
          "--prompts", str(prompt_file), "--max-new-tokens", "16", "--out", str(tmp_path)])  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["online_adapt"] is True
    windows_ = report["drafters"][0]["online"]["windows"]
    assert [w["prompts"] for w in windows_] == [[0, 1], [1, 2]]  # 2 prompts: the 4 windows collapse to 2
    assert "## Online adaptation (OSD)" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("spec", "message"), [("ngram", "trains draft LMs (OSD); this drafter is a NGramDrafter"), ("target", "target")]
)
def test_online_adapt_refuses_drafters_it_cannot_train(model_dirs, prompt_file, capsys, spec, message):
    with pytest.raises(SystemExit) as exc:
        main(["score", f"--target={model_dirs['target']}", "--drafter", spec, "--online-adapt",
              "--prompts", str(prompt_file)])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "draftsmith: error:" in err and message in err and "Traceback" not in err


def test_bad_online_config_is_an_error():
    with pytest.raises(Exception, match="update_every must be positive"):
        OnlineConfig(update_every=0)
