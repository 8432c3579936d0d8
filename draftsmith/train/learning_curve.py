"""A recipe set's measured learning curves, ``configs/SET/learning_curve.json``: τ as a + b·ln(generated training
tokens), per family, passes over the data and held-out set, over the token range it was measured on.

The package owns the file: its format is ``LearningCurves``, made from a data-scaling study's report and recipe
studies' reports (``benchmarks/results/*.json``) by ``measured_curves``, written by ``draftsmith learning-curve``
(``write_curves``; ``benchmarks/tables.py --check`` fails where the shipped file is not what the reports give), and
read by ``read_curves`` (``draftsmith pipeline``'s τ prediction, ``pipeline.predict``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftsmith.core.files import write_whole
from draftsmith.errors import DraftsmithError
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


def least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of τ = a + b·ln(tokens) fitted to ``points`` (tokens, τ) by least squares (the Scylla paper's
    log-linear data scaling)."""
    xs, ys = [math.log(x) for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(1e-12, sum((x - mx) ** 2 for x in xs))
    return my - b * mx, b


def tokens_of(label: str) -> int:
    """The data budget a study row's name ends in (``eagle3_31-250k`` -> 250,000; ``-1M`` -> 1,000,000)."""
    text = label.rsplit("-", 1)[-1]
    return int(float(text[:-1]) * (1_000 if text.endswith("k") else 1_000_000))


def measured_curves(recipes: str, scaling: tuple[str, dict], studies: list[tuple[str, dict]]) -> LearningCurves:
    """The recipe set's learning curves from a data-scaling study's report (its fitted line per family and held-out
    set) and recipe studies' reports (a line fitted per family, passes and set where the reports hold two or more
    data budgets of it, from the rows measured in the scaling study's dtype whose recorded recipe is one of the set's
    families: ``SET/FAMILY``), greedy at the reports' K. ``scaling`` and each of ``studies``: (its path as the file
    names its source, the report)."""
    source, result = scaling
    sizes = sorted({r["size"] for r in result["rows"]})
    curves, by_family = [], {}
    for key, fit in result["curves"].items():
        set_name, family = key.split("/")
        if fit is not None:
            by_family.setdefault(family, {})[set_name] = Line(fit["a"], fit["b"])
    measured = f"{result['machine']['git']} {result['machine']['date']}"
    for family, sets in by_family.items():
        curves.append(
            Curve(
                family=family,
                epochs=result["args"]["epochs"],
                tokens=(sizes[0], sizes[-1]),
                source=source,
                measured=measured,
                sets=sets,
            )
        )
    ks = {
        row["k"]
        for key, block in result["blocks"].items()
        if key.split(" ")[1] == "greedy"
        for row in block["drafters"]
    }
    dtype = result["target"].split(":")[1]
    points, dates = {}, []
    for _, study in studies:
        if study["dtype"] != dtype:
            continue
        dates.append(f"{study['machine']['git']} {study['machine']['date']}")
        for key, block in study["blocks"].items():
            set_name, mode, *_ = key.split(" ")
            if mode != "greedy":
                continue
            for row in block["drafters"]:
                fit = study["fits"].get(row["name"])
                family = fit["recipe"].removeprefix(f"{recipes}/") if fit else ""
                if not fit or family == fit["recipe"] or "/" in family:  # another set's recipe, or a study row
                    continue
                ks.add(row["k"])
                per_set = points.setdefault((family, float(fit["epochs"])), {})
                per_set.setdefault(set_name, []).append((tokens_of(row["name"]), row["tau"]))
    for (family, epochs), sets in points.items():
        budgets = sorted({x for pts in sets.values() for x, _ in pts})
        if len(budgets) < 2:  # one budget: no curve
            continue
        lines = {s: Line(*(round(v, 4) for v in least_squares(sorted(pts)))) for s, pts in sets.items()}
        curves.append(
            Curve(
                family=family,
                epochs=epochs,
                tokens=(budgets[0], budgets[-1]),
                source=" and ".join(name for name, _ in studies),
                measured=", ".join(dates),
                sets=lines,
            )
        )
    if len(ks) != 1:
        raise DraftsmithError(f"learning-curve: the reports' greedy rows draft at K = {sorted(ks)}, not at one K")
    return LearningCurves(result["target"], ks.pop(), curves)


def write_curves(recipe_set: str, scaling: Path, studies: list[Path] | None = None, out: Path | None = None) -> Path:
    """Write the learning curves of the recipe set ``recipe_set`` (``configs/SET/learning_curve.json``, which
    ``draftsmith pipeline`` predicts τ from; ``out``: elsewhere) from a data-scaling study's report
    (``benchmarks/scaling.py``'s results JSON) and recipe studies' reports (``benchmarks/recipe.py``'s), each named
    in the file by the path given here. A study's rows count where their recorded recipe is ``SET/FAMILY``."""
    reports = []
    for path in [scaling, *(studies or [])]:
        try:
            reports.append((str(path), json.loads(Path(path).read_text())))
        except (OSError, ValueError) as e:
            raise DraftsmithError(f"learning-curve: cannot read the report {path}: {e}") from None
    try:
        curves = measured_curves(recipe_set, reports[0], reports[1:])
    except (KeyError, IndexError, AttributeError) as e:
        raise DraftsmithError(
            f"learning-curve: {scaling} must be a data-scaling study's results JSON (benchmarks/scaling.py) and "
            f"{', '.join(map(str, studies or [])) or 'the studies'} recipe studies' (benchmarks/recipe.py); "
            f"missing: {e}"
        ) from None
    out = write_whole(out or curves_file(recipe_set), curves.text())
    print(
        f"learning-curve: {len(curves.curves)} curves ({', '.join(sorted({c.family for c in curves.curves}))}) "
        f"at K = {curves.k} in {out}"
    )
    return out
