"""A recipe set's measured learning curves, ``configs/SET/learning_curve.json``: τ as a + b·ln(generated training
tokens), per family, passes over the data and held-out set, over the token range it was measured on.

The package owns the file: its format is ``LearningCurves``, written by ``LearningCurves.text`` (which
``benchmarks/tables.py`` calls with the curves the data-scaling and recipe studies measured) and read by
``read_curves`` (``draftsmith pipeline``'s τ prediction, ``pipeline.predict``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.train.fit import RECIPES

FILE = "learning_curve.json"


@dataclass(frozen=True)
class Line:
    """τ = a + b·ln(tokens), fitted on one held-out set."""

    a: float
    b: float

    def at(self, tokens: int) -> float:
        return self.a + self.b * math.log(tokens)


@dataclass(frozen=True, kw_only=True)
class Curve:
    """One family's learning curve at one number of passes over its training data."""

    family: str
    epochs: float
    """Passes over the training data each fit made."""
    tokens: tuple[int, int]
    """The fewest and the most generated training tokens measured: the curve holds between them only."""
    source: str
    """The results that measured it (``benchmarks/results/NAME.json``)."""
    measured: str = ""
    """The commit and date of those results."""
    sets: dict[str, Line] = field(default_factory=dict)
    """Held-out set -> its fitted line."""


@dataclass(frozen=True)
class LearningCurves:
    """The file: the target the curves were measured on, the draft length K their τ is at, the curves."""

    target: str
    """The target as ``NAME:DTYPE``."""
    k: int
    curves: list[Curve]

    def text(self) -> str:
        """The file's text (JSON, two-space indent, one final newline)."""
        return json.dumps(asdict(self), indent=2) + "\n"


def curves_file(recipes: str) -> Path:
    """Where the recipe set ``recipes`` (``Plan.recipes``: ``""`` the default set, a name, or a directory) keeps
    its learning curves."""
    return RECIPES / (recipes or ".") / FILE


def read_curves(path: Path) -> LearningCurves:
    """The learning curves written at ``path`` (``LearningCurves.text``)."""
    record = json.loads(path.read_text())
    curves = [
        Curve(**(c | {"tokens": tuple(c["tokens"]), "sets": {s: Line(**f) for s, f in c["sets"].items()}}))
        for c in record["curves"]
    ]
    return LearningCurves(record["target"], record["k"], curves)
