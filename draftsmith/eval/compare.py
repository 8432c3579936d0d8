"""``draftsmith report``: one comparison report (JSON, Markdown, PNG plots) from saved run directories.

A run directory holds ``score/k<K>/report.json`` (from ``draftsmith score``, one per draft length)
and optionally ``fit/<drafter>/csv/version_*/metrics.csv`` (from ``draftsmith fit``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.eval import plots
from draftsmith.eval.report import auto_k_table, markdown_table
from draftsmith.eval.rows import PlainRow, ScoreRow, read_rows, to_dicts
from draftsmith.layers.estimate import did_not_learn


def _scores(run: Path) -> dict[int, dict]:
    reports = {}
    for path in sorted(run.glob("score/k*/report.json")) + sorted(run.glob("score/report.json")):
        data = json.loads(path.read_text())
        reports.setdefault(int(data["config"]["k"]), data)
    return reports


def _fit_logs(run: Path) -> dict[str, list[dict]]:
    logs = {}
    for fit in sorted(p for p in run.glob("fit/*") if p.is_dir()):
        versions = sorted(fit.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1]))
        if versions:
            logs[fit.name] = plots.read_metrics(versions[-1])
    return logs


def _serving(e: dict) -> list[str]:
    """A pipeline run's ``export/best.json`` as Markdown: every scored drafter ranked by measured speed with how an
    engine serves it, the servable ones' commands fastest first, then the trained drafter exported."""
    lines, commands = [], [o for o in e.get("options", []) if o["command"]]
    if e.get("options"):
        scores = e["scores"]  # a run's blocks (each drafter at its fastest of them), or one block (older runs)
        blocks = [scores] if isinstance(scores, str) else scores
        where = ("at its K in " if isinstance(scores, str) else "at its fastest K of ") + ", ".join(
            f"`{b}`" for b in blocks
        )
        lines += [
            f"Every drafter by measured speed, each {where}, the target in {e['dtype']}:",
            "",
            "| | drafter | speedup | τ | K | served |",
            "|---|---|---|---|---|---|",
            *(
                f"| {i} | {o['name']} | {o['speedup']:.2f}× | {o['tau']:.2f} | {o['k']} | {o['served']} |"
                for i, o in enumerate(e["options"], 1)
            ),
            "",
        ]
    for i, o in enumerate(commands):
        what = "the fastest servable" if i == 0 else "also faster than plain decoding"
        lines += [f"`{o['name']}` ({what}, {o['speedup']:.2f}× at K={o['k']}):", "", f"```\n{o['command']}\n```", ""]
    if not e.get("beats_plain", True):
        return [*lines, f"No trained drafter to serve: {e['advice']}."]
    exported = (
        f"`{e['name']}` ({e['speedup']:.2f}× at K={e['k']}, τ {e['tau']:.2f}) exported as {e['format']}: `{e['dir']}`"
    )
    if any(o["name"] == e["name"] for o in commands):
        return [*lines, exported]
    return [*lines, exported, "", f"```\n{e['command']}\n```"]


RISING = 0.01
"""A fit's ``val/tau_est`` "still rising" when its last validation beats every earlier one by more than this share."""


def training_table(logs: dict[str, list[dict]]) -> str:
    """Per fit: optimizer steps, ``val/tau_est`` at its first and last validation and its best, and whether it did
    not learn (its last τ at most ``LEARNED_TAU``: ``layers.estimate.did_not_learn``), had stopped rising (the last
    validation no better than an earlier one, within ``RISING``) or was still rising when the budget ran out (""
    without validations)."""
    lines = []
    for name, rows in logs.items():
        val = [(int(r["step"]), r["val/tau_est"]) for r in rows if "val/tau_est" in r]
        if not val:
            continue
        if not lines:
            lines = ["| fit | steps | val τ_est first | last | best | at the end |", "|---|---|---|---|---|---|"]
        steps = max(int(r["step"]) for r in rows if "step" in r)
        earlier = max((v for _, v in val[:-1]), default=None)
        rising = earlier is None or val[-1][1] > earlier * (1 + RISING)
        state = "still rising: more steps would raise it" if rising else "stopped rising"
        if dead := did_not_learn([(step + 1, v) for step, v in val], ended=True):  # a log's step: steps done - 1
            state = f"did not learn: {dead}"
        best = max(v for _, v in val)
        lines.append(f"| {name} | {steps + 1} | {val[0][1]:.3f} | {val[-1][1]:.3f} | {best:.3f} | {state} |")
    return "\n".join(lines)


def report(runs: list[Path], out: Path | None = None, k: int = 4) -> Path:
    """Regenerate the comparison report of one or more run directories.

    Args:
        runs: run directories (e.g. ``runs/quickstart``); with several, drafter names get the
            run's name as a prefix.
        out: where to write report.json, report.md and the PNGs (default: ``<first run>/report``).
        k: the draft length of the main table, acceptance curves and speedup bars.
    """
    runs = [Path(r) for r in runs]
    by_k: dict[int, list[ScoreRow]] = {}
    plains: dict[int, PlainRow] = {}
    logs: dict[str, list[dict]] = {}
    sources, exported = {}, []
    for run in runs:
        scores = _scores(run)
        if not scores:
            raise DraftsmithError(
                f"report: {run} has no score/k<K>/report.json (run draftsmith score --out {run}/score/k4)"
            )
        prefix = f"{run.name}/" if len(runs) > 1 else ""
        for kk, data in scores.items():
            by_k.setdefault(kk, []).extend(replace(r, name=prefix + r.name) for r in read_rows(data["drafters"]))
            plains.setdefault(kk, PlainRow.from_dict(data["plain"]))
            sources.setdefault(str(run), {})[kk] = data["config"]
        logs.update({prefix + name: rows for name, rows in _fit_logs(run).items()})
        if (run / "export" / "best.json").is_file():
            exported.append(json.loads((run / "export" / "best.json").read_text()))
    if k not in by_k:
        raise DraftsmithError(f"report: no scores at -k {k}; available: {sorted(by_k)}")
    out = Path(out) if out else runs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "acceptance.png": plots.acceptance_curves(by_k[k], out / "acceptance.png"),
        "speedup.png": plots.speedup_bars(by_k[k], plains[k], out / "speedup.png"),
        "tau_vs_k.png": plots.tau_vs_k(by_k, out / "tau_vs_k.png"),
    }
    if logs:
        figures["training.png"] = plots.training_curves(logs, out / "training.png")
    summary = {
        "runs": sources,
        "k": k,
        "plain": plains[k].to_dict(),
        "drafters": to_dicts(by_k[k]),
        "by_k": {kk: to_dicts(rows) for kk, rows in by_k.items()},
        "exported": exported,
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2))
    config = next(iter(sources.values()))[k]
    md = [
        "# draftsmith report",
        "",
        *(f"**{e['verdict']}**\n" for e in exported if e.get("verdict")),
        f"Runs: {', '.join(f'`{r}`' for r in runs)}. Verifier: {config['num_prompts']} prompts from "
        f"`{config['prompts']}`, temperature {config['temperature']}, up to {config['max_new_tokens']} new "
        f"tokens; plain and speculative decoding of the same target measured in the same run.",
        "",
        f"## K = {k}",
        "",
        markdown_table(by_k[k], plains[k]),
        "",
        *[f"![{name}]({name})" for name in figures],
        "",
        "## τ by K",
        "",
        "| drafter | " + " | ".join(f"K={kk}" for kk in sorted(by_k)) + " |",
        "|---|" + "---|" * len(by_k),
    ]
    names = list(dict.fromkeys(r.name for rows in by_k.values() for r in rows))
    for name in names:
        cells = [
            next((f"{r.tau:.2f} ({r.speedup:.2f}×)" for r in by_k[kk] if r.name == name), "–") for kk in sorted(by_k)
        ]
        md.append(f"| {name} | " + " | ".join(cells) + " |")
    for run in runs:
        auto = run / "score" / "auto" / "report.json"
        if auto.is_file():
            data = json.loads(auto.read_text())
            md += ["", f"## K chosen per drafter (--k auto){f': {run.name}' if len(runs) > 1 else ''}", ""]
            rows = read_rows(data["drafters"])
            md += [markdown_table(rows, PlainRow.from_dict(data["plain"])), "", auto_k_table(rows)]
    trained = training_table(logs)
    if trained:
        md += ["", "## Training", "", trained]
    for e in exported:
        md += ["", "## Exported for serving", "", *_serving(e)]
    (out / "report.md").write_text("\n".join(md) + "\n")
    print(markdown_table(by_k[k], plains[k]))
    print(f"wrote {out}/report.md, report.json and {', '.join(figures)}")
    return out
