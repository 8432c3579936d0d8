"""The data-scaling study's report (``benchmarks/scaling.py``'s ``report`` stage): its rows, from the scored blocks
and the fit records; the log-linear curve τ = a + b·ln(tokens) fitted per family and set, with what a doubling of
the data buys; the papers' orderings; an earlier run's rows carried over where it trained on the same corpus; the
plot and the Markdown (``benchmarks/tables.py`` renders ``scaling*.md`` with ``markdown``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from common import RESULTS, draft_vocab_coverage, machine, write
from scaling import RECIPES, TARGET, label, results_name

from draftsmith.data.generate import load_generated
from draftsmith.eval import plots
from draftsmith.eval.report import auto_k_table, markdown_table
from draftsmith.eval.rows import read_block
from draftsmith.train.learning_curve import least_squares, tokens_of
from draftsmith.train.recorded import fit_epochs

GOAL_TAU = 2.2
"""Issue 30's goal for EAGLE-3 (chain, greedy, K = 4, MT-bench): each fitted curve says how much data would reach it."""
ORDERED_FROM = 300_000
"""The subsets the papers' orderings are checked on: this many tokens or more."""
ORDERINGS = [("eagle3", "eagle1"), ("hydrapp", "hydra"), ("hydra", "medusa1")]
"""The papers' orderings by τ (the first above the second), checked per set on the subsets of ``ORDERED_FROM``
tokens or more."""


def coverage(export: Path, val: Path) -> float | None:
    """Share of the held-out generated tokens (the validation data) inside the drafter's draft vocabulary (None: a
    drafter over the whole vocabulary)."""
    share = draft_vocab_coverage(export, val)
    return None if share is None else round(share, 4)


def fit_curve(points: list[tuple[float, float]]) -> dict | None:
    """Least squares τ = a + b·ln(tokens) (the Scylla paper's log-linear data scaling), with each doubling's gain."""
    if len(points) < 2:
        return None
    a, b = least_squares(points)
    per_doubling = [
        round((y2 - y1) / math.log2(x2 / x1), 4)
        for (x1, y1), (x2, y2) in zip(points, points[1:], strict=False)
        if x2 > x1
    ]
    # returns diminish where a doubling of the data, after the best one, first buys less than half of what it bought
    best = max(per_doubling, default=0.0)
    after = per_doubling.index(best) + 1 if per_doubling else 0
    where = next((points[i][0] for i, g in enumerate(per_doubling) if i >= after and best > 0 and g < 0.5 * best), None)
    last_x, last_y = points[-1]
    last = per_doubling[-1] if per_doubling else 0.0
    return {
        "a": round(a, 4),
        "b": round(b, 4),
        "gain_per_doubling": round(b * math.log(2), 4),
        "segments": per_doubling,
        "diminishing_from": where,
        # the tokens at which the fitted line reaches GOAL_TAU (None: it does not rise); an extrapolation
        "tokens_for_goal": round(math.exp((GOAL_TAU - a) / b)) if b > 0 else None,
        # ... and at which the last segment's gain per doubling, kept up from the last point, would reach it
        "tokens_for_goal_last": round(last_x * 2 ** ((GOAL_TAU - last_y) / last)) if last > 0 else None,
    }


def report(args, data, subsets: dict, fits: dict, scores: dict) -> None:
    rows = []
    for size, blocks in scores.items():
        for key, block in blocks.items():
            set_name, mode = key.split(" ")
            plain, scored = read_block(block)
            for d in scored if mode == "greedy" else []:
                if d.name == "ngram":
                    continue
                family = d.name.rsplit("-", 1)[0]
                fit = fits.get((family, size), (None, {}))[1]
                rows.append(
                    ({"run": block["scored"]} if "scored" in block else {})
                    | {
                        "set": set_name,
                        "family": family,
                        "size": size,
                        "rows": subsets[size][0],
                        "tokens": subsets[size][1],
                        "tau": d.tau,
                        "alpha": d.alpha,
                        "accept_at": d.accept_at,
                        "speedup": d.speedup,
                        "ideal": d.ideal_speedup,
                        "plain_tokens_per_s": plain.tokens_per_s,
                        "coverage": coverage(args.out / "drafters" / d.name, data[1]),
                        "fit_seconds": fit.get("seconds"),
                        "fit_sessions": fit.get("sessions", 1),
                        "steps": fit.get("steps"),
                        "epochs": fit_epochs(fit),
                        "val_tau_est": fit.get("val_tau_est"),
                    }
                )
    keep = ("rows", "generated_tokens", "prompt_tokens", "tokens_per_s", "seconds", "engine", "settings", "snapshot")
    keep += ("shards",)  # a finished corpus run's: its snapshot is then all of it
    corpus = {k: v for k, v in load_generated(data[0])[1].items() if k in keep}
    blocks = {f"{key} {label(size)}": b for size, blocks in scores.items() for key, b in blocks.items()}
    prior = earlier_run(subsets, args.results)
    if prior:  # the same corpus: the earlier run's rows and blocks this run has not scored, marked with their run
        scored = {(r["set"], r["family"], r["size"]) for r in rows}
        rows += [r for r in prior["rows"] if (r["set"], r["family"], r["size"]) not in scored]
        blocks |= {k: b for k, b in prior["blocks"].items() if k not in blocks}
        blocks = dict(sorted(blocks.items(), key=lambda kv: block_size(kv[0])))
        if prior["corpus"].get("generated_tokens", 0) > corpus.get("generated_tokens", 0):
            corpus = prior["corpus"] | {"regenerated": corpus}  # this run made its first rows again
    families = [f for f in RECIPES if any(r["family"] == f for r in rows)]
    curves = {
        f"{s}/{f}": fit_curve(sorted((r["tokens"], r["tau"]) for r in rows if r["set"] == s and r["family"] == f))
        for s in ("mt-bench", "chat-heldout")
        for f in families
    }
    result = {
        "machine": machine(),
        "target": TARGET,
        "corpus": corpus,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
        "curves": curves,
        "blocks": blocks,
    }
    result["orderings"] = orderings(rows)
    plot(rows, families, RESULTS / f"{args.results}.png")
    write(args.results, result, markdown(result))


def earlier_run(subsets: dict[int, tuple[int, int]], name: str | None = None) -> dict | None:
    """The committed results of an earlier run (``RESULTS/<name>.json``) when they were made on this
    corpus: each subset both runs recorded, and this corpus holds whole, has the same rows and generated tokens (a
    corpus made again from the same prompts is the same corpus: every row is sampled with its own seed). Its rows
    come back marked with the run that scored them (``run``: git SHA and date), so a benchmark of many hours can
    go on across machines that keep only what was committed. None when there is none or the corpora differ."""
    path = RESULTS / f"{name or results_name()}.json"
    if not path.is_file():
        return None
    prior = json.loads(path.read_text())
    recorded = {r["size"]: (r["rows"], r["tokens"]) for r in prior["rows"]}
    shared = [s for s in recorded if s in subsets and subsets[s][1] >= s]
    if not shared or any(recorded[s] != subsets[s] for s in shared):
        return None
    run = f"{prior['machine']['git']} {prior['machine']['date']}"
    prior["rows"] = [{"run": run} | r for r in prior["rows"]]  # a row carried over twice keeps its first run
    return prior


def block_size(title: str) -> int:
    """A block title's subset size (``mt-bench greedy 1M`` -> 1,000,000): the report lists blocks by size."""
    return tokens_of(title.rsplit(" ", 1)[-1])


def orderings(rows: list[dict]) -> list[dict]:
    """Per set and subset of ``ORDERED_FROM`` tokens or more: each of ``ORDERINGS`` whose two families were scored there,
    with their τ and whether the papers' order holds."""
    out = []
    for s, size in sorted({(r["set"], r["size"]) for r in rows if r["size"] >= ORDERED_FROM}):
        tau = {r["family"]: r["tau"] for r in rows if r["set"] == s and r["size"] == size}
        for hi, lo in ORDERINGS:
            if hi in tau and lo in tau:
                out.append(
                    {
                        "set": s,
                        "size": size,
                        "above": hi,
                        "below": lo,
                        "tau": [tau[hi], tau[lo]],
                        "holds": tau[hi] > tau[lo],
                    }
                )
    return out


def plot(rows: list[dict], families: list[str], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for s, ax in zip(("mt-bench", "chat-heldout"), axes, strict=True):
        for f in families:
            pts = sorted((r["tokens"], r["tau"]) for r in rows if r["set"] == s and r["family"] == f)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f)
        ax.set(xscale="log", title=f"τ at K = 4, {s}", xlabel="generated training tokens", ylabel="τ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    plots.save(fig, path)


def short_dtype(target: str) -> str:
    """``smollm2:bfloat16`` -> ``bf16`` (the report's label for the target's dtype)."""
    dtype = target.rsplit(":", 1)[-1]
    return {"bfloat16": "bf16", "float32": "float32"}.get(dtype, dtype)


def markdown(result: dict) -> str:
    m, c, dtype = result["machine"], result["corpus"], short_dtype(result["target"])
    carried = any("run" in r for r in result["rows"])  # rows of an earlier run: a column names each row's run
    lines = [
        f"# Data scaling: drafters for SmolLM2-135M-Instruct ({dtype})",
        "",
        f"`{m['command']}` at `{m['git']}` on {m['date']} ({m.get('cpu', m['platform'])}"
        f"{', ' + ', '.join(m['cpu_flags']) if m.get('cpu_flags') else ''}; {m['threads']} threads). Corpus: "
        f"{c.get('rows')} answers, {c.get('generated_tokens'):,} generated tokens ({c.get('engine', {}).get('name')} in "
        f"{c.get('settings', {}).get('dtype')}, T {c.get('settings', {}).get('temperature')}, top-p "
        f"{c.get('settings', {}).get('top_p')}, greedy share {c.get('settings', {}).get('greedy_share')}, "
        f"{c.get('tokens_per_s')} tokens/s)"
        + (
            (
                f", the first {snap['shards']} finished shards of {snap['shard_size']} prompts of the corpus run "
                "while it went on (a prefix of the whole corpus)"
                if c.get("shards") != snap["shards"]
                else f", all {snap['shards']} shards of {snap['shard_size']} prompts (a fit made while it went on "
                "trained on its first finished shards: the same rows)"
            )
            if (snap := c.get("snapshot"))
            else ""
        )
        + (
            f". This run generated its first {again['rows']} answers again ({again['generated_tokens']:,} tokens, "
            f"{again['tokens_per_s']} tokens/s) and found each subset they hold the same rows and tokens as in the "
            "run that made the corpus; rows scored by an earlier run name it (scored by)"
            if (again := c.get("regenerated"))
            else ""
        )
        + ". Each subset is a prefix of the corpus (nested); epochs: each fit's passes over its subset (a fit made "
        "earlier is reused as it was made, whatever this run's --epochs). Scored: greedy chains at "
        f"K = 4, each row interleaved per prompt with plain decoding of the same {dtype} target (batch-invariant).",
        "",
        "| set | family | tokens | rows | steps | epochs | fit s | val τ_est | τ | α | per-position acceptance | speedup "
        "| ideal | draft-vocab coverage |" + " scored by |" * carried,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * carried,
    ]
    for r in sorted(result["rows"], key=lambda r: (r["set"], r["family"], r["tokens"])):
        acc = " ".join(f"{a:.2f}" for a in r["accept_at"])
        cov = f"{r['coverage']:.3f}" if r["coverage"] is not None else "–"
        lines.append(
            f"| {r['set']} | {r['family']} | {r['tokens']:,} | {r['rows']} | {r['steps']} | {r.get('epochs')} | "
            f"{r['fit_seconds']}{f' ({n} runs)' if (n := r.get('fit_sessions', 1)) > 1 else ''} | "
            f"{r['val_tau_est'] or 0:.2f} | {r['tau']:.2f} | {r['alpha']:.3f} | {acc} | {r['speedup']:.2f}× | "
            f"{(r['ideal'] or 0):.2f}× | {cov} |" + f" {r.get('run', 'this run')} |" * carried
        )
    lines += [
        "",
        "Log-linear fits τ = a + b·ln(tokens) and the measured gain in τ per doubling of the data, per segment:",
        "",
    ]
    for name, curve in result["curves"].items():
        if curve:
            lines.append(
                f"- {name}: a = {curve['a']}, b = {curve['b']} ({curve['gain_per_doubling']} τ per doubling); "
                f"segments: {', '.join(map(str, curve['segments']))}; "
                + (
                    f"returns diminish from {curve['diminishing_from']:,} tokens (a doubling there buys less than half "
                    "of the best doubling)"
                    if curve["diminishing_from"]
                    else "no diminishing returns within the measured range"
                )
                + (
                    f"; the line reaches τ {GOAL_TAU} at {goal:.3g} tokens (extrapolated)"
                    if (goal := curve.get("tokens_for_goal"))
                    else ""
                )
                + (f", the last segment's rate at {goal:.3g}" if (goal := curve.get("tokens_for_goal_last")) else "")
            )
    for title, block in result["blocks"].items():
        plain, rows = read_block(block)
        lines += ["", f"## {title}", "", markdown_table(rows, plain)]
        if auto_k_table(rows):
            lines += ["", auto_k_table(rows)]
    if result.get("orderings"):
        lines += ["", "The papers' orderings by τ (K = 4, greedy):", ""]
        lines += [
            f"- {o['set']}, {label(o['size'])}: {o['above']} τ {o['tau'][0]:.2f} vs {o['below']} τ {o['tau'][1]:.2f}: "
            + ("holds" if o["holds"] else "does not hold")
            for o in result["orderings"]
        ]
    name = result["args"].get("results") or results_name(result["target"])
    lines += ["", f"![scaling]({name}.png)", ""]
    return "\n".join(lines)
