"""Score reports: ``report.json`` + ``report.md`` written side by side."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.eval.rows import PlainRow, ScoreRow, read_rows


def markdown_table(drafters: list[ScoreRow], plain: PlainRow) -> str:
    """The comparison table, one row per drafter, plain decoding first. When a row is lossy (Judge decoding) or the
    prompts carry checks, two more columns: "lossy" and how many answers pass their checks."""
    extra = any(d.lossy or d.checks_passed is not None for d in drafters)
    head = "| drafter | K | α | τ | per-position acceptance | tokens/s | speedup | ideal | r | c | greedy exact |"
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    plain_row = f"| plain decoding | – | – | 1.00 | – | {plain.tokens_per_s:.1f} | 1.00× | – | – | – | – |"
    if extra:
        head, rule = head + " lossy | checks passed |", rule + "---|---|"
        plain_row += f" no | {_passed(plain)} |"
    lines = [head, rule, plain_row]
    for d in drafters:
        per_pos = " ".join(f"{a:.2f}" for a in d.accept_at)
        exact = "–" if d.greedy_exact is None else f"{d.greedy_exact}/{d.prompts}"
        line = (
            f"| {d.name} | {d.k} | {d.alpha:.3f} | {d.tau:.2f} | {per_pos} | "
            f"{d.tokens_per_s:.1f} | {d.speedup:.2f}× | {d.ideal_speedup:.2f}× | "
            f"{_ratio(d)} | {d.cost_ratio:.3f} | {exact} |"
        )
        if extra:
            line += f" {'yes (judge)' if d.lossy else 'no'} | {_passed(d)} |"
        lines.append(line)
    return "\n".join(lines)


def _passed(row: ScoreRow | PlainRow) -> str:
    return f"{row.checks_passed}/{row.checked}" if row.checks_passed is not None else "–"


def _ratio(d: ScoreRow) -> str:
    """The row's measured verification cost r, or "–" for reports from before it was measured (their ideal
    assumed r = 1)."""
    return f"{d.verify_ratio:.2f}" if d.verify_ratio is not None else "–"


def online_table(drafters: list[ScoreRow]) -> str:
    """α and τ per window of consecutive prompts for drafters that learned online (``--online-adapt``); "" if none."""
    lines = []
    for d in drafters:
        online = d.extra.get("online")  # what the online drafter adds to its row (``extra_metrics``)
        if not online:
            continue
        if not lines:
            lines = ["| drafter | prompts | α | τ | rounds |", "|---|---|---|---|---|"]
        for w in online["windows"]:
            start, end = w["prompts"]
            lines.append(f"| {d.name} | {start + 1}–{end} | {w['alpha']:.3f} | {w['tau']:.2f} | {w['rounds']} |")
    return "\n".join(lines)


def category_table(drafters: list[ScoreRow]) -> str:
    """τ and speedup per prompt category (MT-bench's), one column pair per drafter; "" without categories."""
    rows = [d for d in drafters if d.categories]
    if not rows:
        return ""
    lines = [
        "| category | " + " | ".join(f"{d.name} τ | {d.name} ×" for d in rows) + " |",
        "|---|" + "---|---|" * len(rows),
    ]
    for category in rows[0].categories:
        cells = [d.categories.get(category) for d in rows]
        lines.append(
            f"| {category} | "
            + " | ".join(f"{c['tau']:.2f} | {c['speedup']:.2f}×" if c else "– | –" for c in cells)
            + " |"
        )
    return "\n".join(lines)


def auto_k_table(drafters: list[ScoreRow]) -> str:
    """The draft shape ``--k auto`` chose per drafter, predicted against measured ("" when none chose); a column of
    the retrieval nodes per round chosen when a RASD drafter's fused tree was sized."""
    auto = [d for d in drafters if d.auto_k]
    if not auto:
        return ""
    fused = any(d.auto_k.nodes is not None for d in auto)
    lines = [
        "| drafter | chosen K | tree size |" + (" retrieval nodes |" if fused else "")
        + " source | predicted τ | predicted × | measured τ | measured × |",
        "|---|---|---|" + ("---|" if fused else "") + "---|---|---|---|---|",
    ]  # fmt: skip
    for d in auto:
        a = d.auto_k
        nodes = f" {'–' if a.nodes is None else a.nodes} |" if fused else ""
        lines.append(
            f"| {d.name} | {a.k} | {a.tree_size or '–'} |{nodes} {a.source} | {a.predicted_tau:.2f} | "
            f"{a.predicted_speedup:.2f}× | {d.tau:.2f} | {d.speedup:.2f}× |"
        )
    return "\n".join(lines)


def retrieval_table(drafters: list[ScoreRow]) -> str:
    """RASD rows' retrieval per round: nodes added, milliseconds (inside the drafter's cost c) and the share of
    accepted draft tokens retrieval added ("" without such rows)."""
    rows = [d for d in drafters if "retrieval_ms_per_round" in d.extra]
    if not rows:
        return ""
    lines = [
        "| drafter | retrieval nodes / round | retrieval ms / round | c (retrieval included) | accepted from retrieval |",
        "|---|---|---|---|---|",
    ]
    for d in rows:
        e = d.extra
        lines.append(
            f"| {d.name} | {e['retrieval_nodes_per_round']:.2f} | {e['retrieval_ms_per_round']:.3f} | "
            f"{d.cost_ratio:.3f} | {e['accepted_from_retrieval']:.1%} |"
        )
    return "\n".join(lines)


def write_report(out: Path, report: dict) -> None:
    """``report`` (as saved: its rows as dicts) to ``out/report.json`` and ``out/report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    cfg = report["config"]
    rows = read_rows(report["drafters"])
    md = [
        "# draftsmith score",
        "",
        f"Target `{report['target']['name']}` in {cfg.get('dtype', 'float32')}"
        f"{' (batch-invariant)' if cfg.get('batch_invariant') else ''} on {cfg['num_prompts']} prompts from "
        f"`{cfg['prompts']}`, k {cfg['k']}, "
        f"temperature {cfg['temperature']}, top-p {cfg['top_p']}, up to {cfg['max_new_tokens']} new tokens, "
        f"seed {cfg['seed']}; plain and speculative decoding measured in the same run.",
        "",
        markdown_table(rows, PlainRow.from_dict(report["plain"])),
        "",
        "α: accepted/drafted tokens. τ: tokens per target verification call. Per-position: share of rounds "
        "whose i-th draft token was accepted. Speedup: tokens/s over plain decoding of the same target. "
        "Ideal: τ/(r+K̄c), r = target time to verify a round's tokens / its time per decoding step (measured in the "
        "run), c = drafter time per drafted token / target time per decoding step.",
        "",
    ]
    machine = report.get("machine", {})
    if "cpu" in machine:
        md += [f"Machine: {machine['cpu']} ({', '.join(machine['cpu_flags'])}), {machine['threads']} threads.", ""]
    auto = auto_k_table(rows)
    if auto:
        md += ["## --k auto", "", auto, ""]
    retrieval = retrieval_table(rows)
    if retrieval:
        md += ["## Retrieval (RASD)", "", retrieval, ""]
    categories = category_table(rows)
    if categories:
        md += ["## Per category", "", categories, ""]
    online = online_table(rows)
    if online:
        md += [
            "## Online adaptation (OSD)",
            "",
            "Each draft LM learned from the positions where its drafts were rejected, prompt after prompt "
            "(KL to the target's distribution there); α and τ per window of consecutive prompts:",
            "",
            online,
            "",
        ]
    (out / "report.md").write_text("\n".join(md))
