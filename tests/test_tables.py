"""The result tables in the README, ``docs/`` and ``benchmarks/results/*.md`` are the ones their JSON gives
(``python benchmarks/tables.py`` writes them): a figure typed in by hand, or left behind when a benchmark reran, fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tables  # noqa: E402


@pytest.fixture(scope="module")
def expected() -> dict[Path, str]:
    return tables.expected()


def test_every_generated_table_matches_its_json(expected):
    stale = [str(p.relative_to(tables.ROOT)) for p, text in expected.items() if p.read_text() != text]
    assert not stale, f"run python benchmarks/tables.py: {stale}"
    assert tables.ROOT / "README.md" in expected  # the README's headline is generated
    assert tables.RESULTS / "scaling.md" in expected


def test_a_figure_edited_by_hand_is_caught(expected):
    readme = expected[tables.ROOT / "README.md"]
    start = readme.index("<!-- table:scaling_headline -->")
    row = next(line for line in readme[start:].splitlines() if line.startswith("| ngram |"))
    edited = readme.replace(row, row.replace("×", "0×", 1))
    assert edited != readme and tables.render(edited) == readme
    # a results file is its benchmark's Markdown of its JSON: change the JSON and the expected Markdown follows
    data = tables.load("bf16_target")
    plain = data["sets"]["chat-heldout"]["plain"]["bf16 batch-invariant"]
    before = tables.importlib.import_module("bf16_target").markdown(data)
    plain["tokens_per_s"] += 10.0
    after = tables.importlib.import_module("bf16_target").markdown(data)
    assert (
        f"| {plain['tokens_per_s']:.1f} |" in after and after != before == expected[tables.RESULTS / "bf16_target.md"]
    )


def test_an_unknown_table_name_is_refused():
    with pytest.raises(SystemExit, match="unknown table 'nosuch'"):
        tables.render("<!-- table:nosuch -->\n<!-- /table -->")
