"""A fit as a study records it (``benchmarks/scaling.py``'s, the recipe study's): resumed from its last checkpoint
when interrupted, its wall time kept across sessions (``Stopwatch``), and a record beside its run dir, ``RUN.json``:
steps, rows, generated tokens, batch, epochs, seconds, generated tokens trained per second (with and without the
validations' seconds, ``train.cli.ValidationClock``), the process's peak RSS,
the machine's load, precision and the export's val τ_est (``recorded_fit``; read back with ``fit_epochs``)."""

from __future__ import annotations

import gc
import json
import os
import resource
from pathlib import Path

from draftsmith.core.files import Stopwatch, write_whole
from draftsmith.targets import ResolvedTarget
from draftsmith.train.fit import FitRun, configure, fit_export

RECORDED_BATCH = 8
"""The batch of the records made before a record gave its own (``batch_size``)."""


def recorded_fit(
    recipe: str | Path, run: FitRun, target: ResolvedTarget, export: Path, tokens: int
) -> tuple[Path, dict]:
    """``fit_export`` of ``recipe`` with ``run`` (its ``data.train_rows`` rows holding ``tokens`` generated tokens;
    ``resume`` to continue an interrupted one) to ``export``, timed across sessions (``RUN.partial.json``) and recorded
    in ``RUN.json`` beside the run dir ``run.out``; a fit recorded and exported before is not run again. Returns the
    export dir and the record."""
    rows, steps, batch = run.data["train_rows"], run.steps, run.batch_size
    record_path, clock_path = Path(f"{run.out}.json"), Path(f"{run.out}.partial.json")
    if record_path.is_file() and (export / "config.json").is_file():
        return export, json.loads(record_path.read_text())
    precision = configure(recipe, run)["trainer"].get("precision")
    print(f"fit: {Path(run.out).name}: {rows} rows, {steps} steps of {batch} ({precision})")
    load = os.getloadavg()[0]
    with Stopwatch(clock_path) as clock:  # a fit resumed later adds its time
        fit_export(recipe, run, target, export)
    gc.collect()  # the fit's feature cache (GBs) before the next fit loads its own
    from draftsmith.train.cli import VALIDATION_SECONDS  # Lightning's import: only once a fit has run

    clocked = Path(run.out) / VALIDATION_SECONDS
    validating = json.loads(clocked.read_text())["seconds"] if clocked.is_file() else None
    trained = tokens * steps * batch / rows  # generated tokens passed through the drafter, passes counted
    record = {
        "trainer": "draftsmith",
        "steps": steps,
        "rows": rows,
        "tokens": tokens,
        "batch_size": batch,
        "epochs": round(steps * batch / rows, 2),
        "seconds": round(clock.seconds, 1),
        "tokens_per_s": round(trained / clock.seconds, 1),
        "validation_seconds": validating,
        "train_tokens_per_s": round(trained / (clock.seconds - validating), 1)
        if validating is not None and clock.seconds > validating
        else None,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "sessions": clock.sessions,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "precision": precision,
        "val_tau_est": json.loads((export / "config.json").read_text()).get("val_tau_est"),
    }
    write_whole(record_path, json.dumps(record, indent=2))
    return export, record


def fit_epochs(fit: dict) -> float | None:
    """Passes over its rows a fit made (``recorded_fit``'s record: ``steps`` of its ``batch_size``,
    ``RECORDED_BATCH`` in records made before it was recorded, of its ``rows``)."""
    batch = fit.get("batch_size", RECORDED_BATCH)
    return round(fit["steps"] * batch / fit["rows"], 2) if fit.get("steps") and fit.get("rows") else None
