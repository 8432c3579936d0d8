"""The τ the recipe set's measured learning curves predict for a run's training data, printed before the data is
made (``draftsmith pipeline``'s target stage)."""

from __future__ import annotations

from pathlib import Path

from draftsmith import targets
from draftsmith.train.learning_curve import curves_file, read_curves
from draftsmith.train.suite import Plan


def predicted_tau(plan: Plan, target: targets.ResolvedTarget, tokens: int) -> str:
    """What the learning curves measured for this recipe set and target (``configs/SET/learning_curve.json``, written
    by ``benchmarks/tables.py`` from the data-scaling and recipe studies in ``train.learning_curve``'s format) predict
    for ``tokens`` generated training tokens, per family the run trains, at the run's passes over the data
    (``plan.budget.epochs``), in words: τ at least 1 (a round commits the target's own token), and only within the
    token range the curve was measured over (outside it, said so instead of a number); or why there is no
    prediction."""
    path = curves_file(plan.recipes)
    if not path.is_file():
        return f"no learning curve measured for the recipe set {plan.recipes or 'default'}"
    record = read_curves(path)
    measured_on = record.target.split(":")[0]
    if Path(target.spec.source).name != measured_on:
        return f"no learning curve measured for this target (the recipe set's is {measured_on}'s)"
    epochs, parts = plan.budget.epochs, []
    if epochs <= 0:
        return "no learning curve for a run of its recipes' own steps (the curves are per passes over the data)"
    for family in plan.drafters:
        mine = [c for c in record.curves if c.family == family]
        curve = next((c for c in mine if c.epochs == epochs), None)
        if curve is None:
            if mine:
                passes = " / ".join(f"{c.epochs:g}" for c in mine)
                parts.append(f"{family}: measured at {passes} passes, not at this run's {epochs:g}")
            continue
        lo, hi = curve.tokens
        if not lo <= tokens <= hi:  # a + b·ln(tokens) beyond its points is a guess (below them it falls below 1)
            parts.append(
                f"{family}: no prediction for {tokens:,} tokens, outside the measured {lo:,}–{hi:,} ({curve.source})"
            )
            continue
        # a round commits at least the target's own token: τ < 1 is impossible, whatever a fitted line says
        taus = " / ".join(f"{max(1.0, line.at(tokens)):.2f} {s}" for s, line in curve.sets.items())
        parts.append(f"{family} {taus} (within the measured {lo:,}–{hi:,}; {curve.source})")
    if not parts:
        return f"no learning curve measured for {', '.join(plan.drafters) or 'these families'}"
    return (
        f"τ at K = {record.k} predicted for {tokens:,} generated tokens and {epochs:g} passes over them: "
        + "; ".join(parts)
    )
