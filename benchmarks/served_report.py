"""``benchmarks/served.py``'s report: a measured cell's figures (each side's tokens/s and time per output token, the
speedup, vLLM's acceptance) and the Markdown of a run's cells per set and batch (``benchmarks/tables.py`` renders
``served*.md`` with ``markdown``)."""

from __future__ import annotations

from common import fmt, measured_on


def totals(chunks: list[dict], who: str) -> dict:
    """tokens/s (all tokens / all seconds) and mean time per output token (ms) of one side of a cell."""
    tokens = sum(sum(c[who]["tokens"]) for c in chunks)
    seconds = sum(c[who]["seconds"] for c in chunks)
    per_token = [s / (n - 1) for c in chunks for n, s in zip(c[who]["tokens"], c[who]["token_seconds"], strict=True)
                 if s is not None and n > 1]  # fmt: skip
    tpot = 1e3 * sum(per_token) / len(per_token) if per_token else None
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0, "tpot_ms": tpot}


def summary(cell: dict) -> dict:
    """A measured cell's figures: each side's totals, the speedup, acceptance, outputs equal to plain's."""
    chunks = cell["chunks"]
    plain, drafter = totals(chunks, "plain"), totals(chunks, "drafter")
    c = cell.get("counters") or {}
    drafts, drafted, accepted = (c.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
    return {
        "plain": plain,
        "drafter": drafter,
        "speedup": drafter["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] else 0.0,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "alpha": accepted / drafted if drafted else None,
        "counters": c,
        "same": sum(ch["same"] for ch in chunks),
        "rows": sum(len(ch["plain"]["tokens"]) for ch in chunks),
    }


def pooled_plain(cells: list[dict], label: str, batch: int) -> dict:
    """Plain decoding at one (set, batch): every drafter's interleaved plain chunks pooled."""
    chunks = [ch for c in cells if c["set"] == label and c["batch"] == batch and "chunks" in c for ch in c["chunks"]]
    return totals(chunks, "plain") if chunks else {}


def markdown(result: dict) -> str:
    """The tables: per set, plain and each drafter at each batch (tokens/s, speedup, ms per token), the first batch
    at which the drafter stops paying, vLLM's mean acceptance length beside the verifier's τ."""
    cells, batches, a = result["cells"], result["batches"], result["args"]
    lines = [
        f"# Served speed in vLLM: {result['target_name']}",
        "",
        f"vLLM {result['vllm']} (CPU build, {result['dtype']}: {result['dtype_why']}; "
        f"{'enforce_eager' if result['eager'] else 'compiled'}), greedy, K = {a['k']} (Medusa and parallel drafters: "
        f"at most their heads / depth), {a['prompts']} prompts per set × up to {a['new_tokens']} new tokens "
        "(stopping at EOS). A batch of b: b prompts submitted together. Each drafter's cell alternates its chunks with "
        "plain decoding's (ABBA); the speedup is over those plain chunks, plain's row pools them all. ms/token: vLLM's "
        "time from a row's first token to its last / (tokens - 1), mean over rows. Mean acceptance length: 1 + "
        "accepted / drafts of vLLM's spec-decode counters over all batches (a step without a draft, as the n-gram's "
        "without a match, is not counted); vLLM τ: tokens per decoding step over all steps, (tokens - rows) / (tokens "
        "- rows - accepted), as the verifier counts τ (the first token of a row comes from its prefill); τ: the "
        "verifier's, from the score named (K, prompts × tokens there); gap: between the two τ. Outputs = plain: rows "
        "equal to plain decoding's in the same chunk.",
        "",
    ]
    for label in result["sets"]:
        head = " | ".join(f"b={b} tokens/s | speedup | ms/token" for b in batches)
        lines += [f"## {label}", "", f"| drafter (K) | {head} | stops paying at | vLLM mean acc. length | "
                  "vLLM τ | verifier τ | gap | outputs = plain |", "|---|" + "---|---|---|" * len(batches) + "---|" * 6]  # fmt: skip
        plain = [pooled_plain(cells, label, b) for b in batches]
        row = " | ".join(f"{fmt(p.get('tokens_per_s'), '.1f')} | 1.00× | {fmt(p.get('tpot_ms'), '.1f')}" for p in plain)
        lines.append(f"| plain | {row} | – | – | – | – | – | – |")
        for name, d in result["drafters"].items():
            mine = {c["batch"]: c for c in cells if c["set"] == label and c["drafter"] == name}
            parts, stops, drafts, accepted, same, rows, tokens = [], "–", 0, 0, 0, 0, 0
            for b in batches:
                c = mine.get(b)
                if c is None or "error" in c:
                    parts.append("failed | – | –" if c else "– | – | –")
                    continue
                s = c["summary"]
                speed = f"{s['speedup']:.2f}×"
                parts.append(f"{s['drafter']['tokens_per_s']:.1f} | {speed if s['speedup'] >= 1 else f'**{speed}**'} | "
                             f"{fmt(s['drafter']['tpot_ms'], '.1f')}")  # fmt: skip
                if s["speedup"] < 1 and stops == "–":
                    stops = f"b={b}"
                drafts += s["counters"].get("num_drafts", 0)
                accepted += s["counters"].get("num_accepted_tokens", 0)
                same, rows, tokens = same + s["same"], rows + s["rows"], tokens + s["drafter"]["tokens"]
            length = 1 + accepted / drafts if drafts else None
            steps = tokens - rows - accepted
            served_tau = (tokens - rows) / steps if drafts and steps > 0 else None
            score = result["scores"].get(label, {}).get(name)
            tau = f"{score['tau']:.2f} (K={score['k']}, {score['prompts']} × {score['tokens']})" if score else "–"
            gap = f"{100 * abs(served_tau - score['tau']) / score['tau']:.1f}%" if score and served_tau else "–"
            lines.append(f"| {name} ({d['k']}) | {' | '.join(parts)} | {stops} | {fmt(length, '.2f')} | "
                         f"{fmt(served_tau, '.2f')} | {tau} | {gap} | {same}/{rows} |")  # fmt: skip
        lines.append("")
    failed = [c for c in cells if "error" in c]
    lines += [f"- {c['drafter']}, {c['set']}, b={c['batch']}: failed: {c['error']}" for c in failed]
    notes = [f"- {n}: {d['note']}" for n, d in result["drafters"].items() if d.get("note")]
    lines += notes + ([""] if failed or notes else [])
    lines.append(f"{measured_on(result['machine'])}; load average {result['load'][0]} → {result['load'][1]}.")
    if result.get("kept"):
        lines.append(f"Kept from this report's earlier run, as measured (drafters this run did not name): "
                     f"{', '.join(result['kept'])}.")  # fmt: skip
    measured = [c for c in cells if "error" not in c]
    if len(result.get("computed", [])) < len(measured):  # cells saved by an earlier run: its SHA and date, not this
        runs = sorted({f"`{c['measured']['git']}` on {c['measured']['date']}" if c.get("measured") else "unrecorded"
                       for c in measured})  # fmt: skip
        lines.append(f"This run measured {len(result.get('computed', []))} of the {len(measured)} cells; the others were "
                     f"reused from `{a.get('out', '--out')}/cells` (or this report's earlier JSON), measured by an "
                     f"earlier run with the same inputs" + (f" (cells measured at {', '.join(runs)})." if runs else "."))  # fmt: skip
    return "\n".join(lines) + "\n"
