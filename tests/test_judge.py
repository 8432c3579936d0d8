"""Judge decoding (lossy by design): the rule keeps exactly what the judge accepts, the labels are what they say, the
fit separates what it can, and score never reports a judged row as exact."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.core.sampling import Sampling
from draftsmith.core.trees import TreeKind
from draftsmith.data.checks import passes
from draftsmith.data.records import Prompt
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.families.judge import JudgeHead, load_judge, save_judge
from draftsmith.families.judge.train import JudgeConfig, fit_head, make_labels
from draftsmith.families.specs import DraftModel, build_drafter
from draftsmith.targets import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")


def fixed_judge(hidden: int, accept: bool) -> JudgeHead:
    head = JudgeHead(hidden)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(30.0 if accept else -30.0)
    return head


def random_judge(hidden: int, seed: int = 0) -> JudgeHead:
    torch.manual_seed(seed)
    head = JudgeHead(hidden, threshold=0.5)
    with torch.no_grad():
        head.linear.weight.normal_(0, 1.0)
        head.linear.bias.zero_()
    return head


@pytest.fixture(scope="module")
def draft_lm(model_dirs, target):
    return lambda: build_drafter(DraftModel(str(model_dirs["drafter"])), target)


def test_a_judge_that_accepts_nothing_is_the_lossless_rule(target, draft_lm, prompts):
    never = fixed_judge(target.hidden_size, accept=False)
    for sampling in (Sampling(0.0), Sampling(0.9, 0.95)):
        for i, prompt in enumerate(prompts):
            plain = SpeculativeDecoder(target, draft_lm(), 3, sampling).generate(
                prompt, 24, torch.Generator().manual_seed(i)
            )
            judged = SpeculativeDecoder(target, draft_lm(), 3, sampling, judge=never).generate(
                prompt, 24, torch.Generator().manual_seed(i)
            )
            assert judged.tokens == plain.tokens  # same draws, same rule
            assert sum(judged.judged) == 0
        if sampling.greedy:
            assert judged.tokens == plain_decode(target, prompt, 24, sampling).tokens


def test_a_judge_that_accepts_everything_keeps_every_draft(target, draft_lm, prompts):
    always = fixed_judge(target.hidden_size, accept=True)
    result = SpeculativeDecoder(target, draft_lm(), 4, Sampling(0.0), judge=always).generate(prompts[1], 30)
    assert result.accepted[:-1] == result.drafted[:-1]
    assert sum(result.judged) > 0


def test_greedy_output_leaves_the_target_only_where_the_judge_accepted(target, draft_lm, prompts):
    """Teacher-forced over the judged output: every token that is not the target's argmax after its prefix was a
    draft token the judge accepted there (reading the target's final hidden state at its position)."""
    head = random_judge(target.hidden_size)
    rescued = 0
    for prompt in prompts:
        result = SpeculativeDecoder(target, draft_lm(), 4, Sampling(0.0), judge=head).generate(prompt, 32)
        out = target(torch.tensor([prompt + result.tokens]), feature_layers=(target.num_layers,))
        start = len(prompt)
        argmax = out.logits[0, start - 1 : -1].argmax(-1).tolist()
        prob = torch.sigmoid(head(out.features[0][0, start:])).tolist()
        for i, token in enumerate(result.tokens):
            if token != argmax[i]:
                assert prob[i] >= head.threshold, f"token {i} left the target without the judge ({prob[i]:.3f})"
                rescued += 1
    assert rescued > 0, "the judge never kept a token: the test would pass for a rule that ignores it"


def test_judged_trees_are_refused(target, draft_lm, prompts):
    from draftsmith.layers.tree_draft import TreePolicy

    drafter = draft_lm()
    drafter.set_tree(TreePolicy(TreeKind.SAMPLED, 16, 4, branching=(2, 1)), 2)
    decoder = SpeculativeDecoder(target, drafter, 2, Sampling(0.8), judge=fixed_judge(target.hidden_size, True))
    with pytest.raises(DraftsmithError, match="judge decoding verifies chains"):
        decoder.generate(prompts[0], 8, torch.Generator().manual_seed(0))


def test_labels_are_forced_continuations_checked(target, tokenizer):
    """Each label is the check of the target's own greedy continuation after the forced alternative, and each
    feature is the target's final hidden state where it reads that alternative (recomputed one at a time)."""
    prompts = [Prompt(text=f"w{i} w{i + 3} w{i + 7}", check={"kind": "contains", "answer": "w4"}) for i in range(4)]
    cfg = JudgeConfig(alternatives=1, max_new_tokens=5, batch_size=3)
    labels = make_labels(target, prompts, cfg, progress=False)
    assert len(labels["labels"]) == len(labels["forced"]) > 8
    assert 0 < labels["labels"].float().mean() < 1, "one class only: the check would not be exercised"
    for n, (i, forced, more) in enumerate(labels["forced"]):
        ids = tokenizer(prompts[i].text, add_special_tokens=False)["input_ids"]
        rest = plain_decode(target, ids + forced, more, Sampling(0.0)).tokens if more else []
        text = tokenizer.decode(forced + rest, skip_special_tokens=True)
        assert bool(labels["labels"][n]) == passes(prompts[i].check, text)
        hidden = target(torch.tensor([ids + forced]), feature_layers=(target.num_layers,)).features[0][0, -1]
        torch.testing.assert_close(labels["features"][n], hidden, atol=1e-4, rtol=1e-4)


def test_fit_separates_a_linear_rule_and_bounds_false_accepts():
    """On features whose label is a linear rule, the fitted head (which reads raw, unstandardised features) ranks
    held-out prompts' labels well, and its threshold accepts at most the allowed share of incorrect ones."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=g) * 5 + 3  # far from standardised: the folding must be right
    w = torch.randn(16, generator=g)
    labels = {"features": x, "labels": (x - 3) @ w > 0.5, "prompt": torch.arange(2000) % 40}
    head, report = fit_head(labels, JudgeConfig(max_false_accept=0.05, steps=300), num_prompts=40)
    assert report["val_auc"] > 0.97
    assert report["val_false_accept"] <= 0.05
    assert report["val_true_accept"] > 0.5
    p = torch.sigmoid(head(x))
    assert ((p >= head.threshold) == labels["labels"]).float().mean() > 0.85


def test_a_judge_for_another_target_is_refused(target, tmp_path, model_dirs):
    from draftsmith.core.target import Target

    save_judge(random_judge(target.hidden_size), target, tmp_path / "judge")
    assert load_judge(tmp_path / "judge", target).threshold == 0.5
    other = Target.from_pretrained(model_dirs["drafter"])
    with pytest.raises(DraftsmithError, match="judge head .* was made for target .* differ in"):
        load_judge(tmp_path / "judge", other)
    with pytest.raises(DraftsmithError, match="not a judge dir"):
        load_judge(tmp_path, target)


def test_score_reports_judged_rows_as_lossy_with_their_checks(model_dirs, tmp_path, capsys):
    from draftsmith.core.target import Target
    from draftsmith.eval.score import score

    target = Target.from_pretrained(model_dirs["target"])
    save_judge(random_judge(target.hidden_size), target, tmp_path / "judge")
    prompts = tmp_path / "checked.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"w{i} w{i + 1}", "check": {"kind": "contains", "answer": "w1"}}) + "\n"
            for i in range(3)
        )
    )
    report = score(resolve_target(str(model_dirs["target"])), [f"d={model_dirs['drafter']}"], prompts=str(prompts), max_new_tokens=12,
                   judge=str(tmp_path / "judge"), out=tmp_path / "score")  # fmt: skip
    rows = {r["name"]: r for r in report["drafters"]}
    assert set(rows) == {"d", "d+judge"}
    assert rows["d+judge"]["lossy"] is True and "lossy" not in rows["d"]
    assert rows["d"]["greedy_exact"] == 3 and rows["d"]["checks_passed"] == report["plain"]["checks_passed"]
    assert rows["d+judge"]["checked"] == 3 and "divergences" not in rows["d+judge"]
    assert "| d+judge |" in capsys.readouterr().out and "yes (judge)" in (tmp_path / "score" / "report.md").read_text()
    unchecked = tmp_path / "plain.jsonl"
    unchecked.write_text('{"prompt": "w1 w2"}\n')
    with pytest.raises(DraftsmithError, match="--judge is lossy"):
        score(
            resolve_target(str(model_dirs["target"])),
            ["d=ngram"],
            prompts=str(unchecked),
            judge=str(tmp_path / "judge"),
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1", "check": {"kind": "regex"}}\n')
    with pytest.raises(DraftsmithError, match="bad.jsonl:1: 'check' must be"):
        score(resolve_target(str(model_dirs["target"])), ["d=ngram"], prompts=str(bad))
