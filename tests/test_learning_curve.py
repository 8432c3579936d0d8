"""A recipe set's learning curves (``configs/SET/learning_curve.json``) are the package's file: read back and
written again, the shipped one is the same bytes, and ``draftsmith learning-curve`` makes it from the studies'
results JSON."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.train.learning_curve import (
    LearningCurves,
    curves_file,
    least_squares,
    read_curves,
    tokens_of,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_learning_curve_reads_back_and_writes_the_same_bytes():
    path = curves_file("smollm2")
    curves = read_curves(path)
    assert isinstance(curves, LearningCurves) and curves.k == 4 and curves.target.startswith("smollm2")
    assert {c.family for c in curves.curves} >= {"eagle1", "eagle3_31"}
    assert all(c.tokens[0] < c.tokens[1] and c.sets and c.measured for c in curves.curves)
    assert curves.text() == path.read_text()


def test_a_line_reads_tau_at_a_number_of_tokens():
    curve = read_curves(curves_file("smollm2")).curves[0]
    line = next(iter(curve.sets.values()))
    assert line.at(1) == line.a  # ln 1 = 0


def test_draftsmith_learning_curve_writes_the_shipped_file_from_the_committed_reports(tmp_path, monkeypatch):
    """The package command makes the file the pipeline reads from the studies' results JSON (the paths as given
    name each curve's source)."""
    monkeypatch.chdir(ROOT)
    results = Path("benchmarks/results")
    main(
        [
            "learning-curve",
            "--recipe-set",
            "smollm2",
            "--scaling",
            str(results / "scaling_families.json"),
            "--studies",
            str(results / "recipe_smollm2_250k.json"),
            str(results / "recipe_smollm2.json"),
            "--out",
            str(tmp_path / "learning_curve.json"),
        ]
    )
    assert (tmp_path / "learning_curve.json").read_text() == curves_file("smollm2").read_text()
    # the recipe study's EAGLE-3.1 rows at 250k and 1M, 2 and 4 passes: a curve each (a study-only row is none)
    written = read_curves(tmp_path / "learning_curve.json")
    studied = {(c.family, c.epochs, c.tokens) for c in written.curves if "recipe_smollm2" in c.source}
    assert studied == {("eagle3_31", 2.0, (250_000, 1_000_000)), ("eagle3_31", 4.0, (250_000, 1_000_000))}


def test_a_report_of_another_study_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    args = ["learning-curve", "--recipe-set", "smollm2", "--out", str(tmp_path / "out.json")]
    with pytest.raises(SystemExit):
        main([*args, "--scaling", "benchmarks/results/recipe_smollm2.json"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be a data-scaling study's results JSON" in err, err
    assert not (tmp_path / "out.json").exists()


def test_least_squares_recovers_a_log_linear_line():
    points = [(tokens, 0.25 + 0.125 * math.log(tokens)) for tokens in (22_000, 100_000, 1_000_000)]
    a, b = least_squares(points)
    assert a == pytest.approx(0.25) and b == pytest.approx(0.125)
    assert tokens_of("eagle3_31-250k") == 250_000 and tokens_of("1M") == 1_000_000
