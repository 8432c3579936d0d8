"""A recipe set's learning curves (``configs/SET/learning_curve.json``) are the package's file: read back and
written again, the shipped one is the same bytes (``benchmarks/tables.py`` writes it through the same format)."""

from __future__ import annotations

from draftsmith.train.learning_curve import LearningCurves, curves_file, read_curves


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
