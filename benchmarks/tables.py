"""Every result table in the README, ``docs/`` and ``benchmarks/results/*.md`` rebuilt from the results' JSON.

    python benchmarks/tables.py           # rewrite them
    python benchmarks/tables.py --check   # exit 1 naming each file whose tables differ from its JSON (CI's test)

Two kinds of table:
- ``benchmarks/results/NAME.md`` of the benchmarks whose Markdown is a function of their JSON (``MARKDOWN``): the
  script's own ``markdown(result)``;
- blocks in the README and ``docs/*.md`` between ``<!-- table:NAME -->`` and ``<!-- /table -->``: ``TABLES[NAME]``
  of the JSON, with the command, git SHA, date and machine that measured it under the table.

A figure in the docs is therefore always the measured one: edit the JSON's benchmark, not the Markdown.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from draftsmith.train.learning_curve import curves_file, measured_curves

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKDOWN = {
    "adaptive": "adaptive",
    "baselines": "baselines",
    "baselines_smollm2": "baselines",
    "bf16_target": "bf16_target",
    "bf16_target_amx": "bf16_target",
    "bf16_target_amx_eagle3": "bf16_target",
    "bf16_target_amx_sdpa": "bf16_target",
    "bf16_target_avx2": "bf16_target",
    "bf16_target_avx2_probed": "bf16_target",
    "bf16_target_prepacked": "bf16_target",
    "bf16_target_sdpa": "bf16_target",
    "xvocab": "xvocab",
    "draftlm": "draftlm",
    "dspark_smollm2": "dspark",
    "export_vllm": "export_vllm",
    "gpu_check": "gpu_check",
    "gpu_check_fit": "gpu_check",
    "heads_default": "heads",
    "judge": "judge",
    "heads_smollm2": "heads",
    "multidraft_default": "multidraft",
    "multidraft_smollm2": "multidraft",
    "parallel_default": "parallel",
    "parallel_smollm2": "parallel",
    "peers_smollm2": "peers",
    "peers_smollm2_250k": "peers",
    "peers_smollm2_250k_headrand": "peers",
    "peers_smollm2_deciding": "peers",
    "peers_smollm2_lr250k": "peers",
    "peers_smollm2_trainers": "peers",
    "peers_smollm2_trainers_epyc": "peers",
    "quickstart": "quickstart",
    "rasd_smollm2": "rasd",
    "recipe_smollm2": "recipe",
    "recipe_smollm2_float32": "recipe",
    "recipe_smollm2_250k": "recipe",
    "recipe_smollm2_amx": "recipe",
    "rasd_smollm2_deep": "rasd",
    "rasd_smollm2_31": "rasd",
    "rasd_smollm2_amx": "rasd",
    "real_target": "real_target",
    "real_target_bf16": "real_target",
    "scaling": "scaling_report",
    "scaling_families": "scaling_report",
    "scaling_float32": "scaling_report",
    "s2d": "s2d",
    "served": "served_report",
    "served_amx": "served_report",
    "served_float32": "served_report",
    "tlt_smollm2": "tlt",
    "tlt_smollm2_k2": "tlt",
    "train": "train",
    "verifier": "verifier",
}
"""Results file -> the benchmark module whose ``markdown(result)`` wrote its Markdown. Not here: the benchmarks that
build their Markdown inline (their ``.md`` is as they wrote it), ``baselines_before`` (a snapshot from before
a change, in the JSON layout of its day), and the retired studies' (``benchmarks/RETIRED.md``: their script is gone,
their ``.md`` is as its last run wrote it)."""
BLOCK = re.compile(r"(<!-- table:(.+?) -->\n)(.*?)(<!-- /table -->)", re.S)
"""A generated block: ``<!-- table:KIND -->`` or ``<!-- table:KIND:ARG -->``, its table, ``<!-- /table -->``."""


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def source(result: dict) -> str:
    """The line under a table: what measured it, where and when."""
    m = result["machine"]
    cpu = f"{m['cpu']} ({', '.join(m['cpu_flags'])})" if "cpu" in m else m.get("platform", "?")
    return (
        f"Measured by `{m['command']}` (git {m.get('git') or '?'}, {m['date']}, {cpu}, {m['threads']} threads, "
        f"torch {m['torch']}"
        + (f", machine load {result['load'][0]:.2f} → {result['load'][1]:.2f}" if "load" in result else "")
        + ")."
    )


def headline(name: str = "real_target_bf16") -> str:
    """The README's one table: every drafter on SmolLM2 at K = 4 and at the K ``--k auto`` chose, greedy, per prompt
    set: τ, first-token acceptance, speedup over plain decoding of the same target in the same run, exactness."""
    from draftsmith.eval.rows import read_block, read_rows

    result = load(name)
    blocks = result["blocks"]
    sets = list(dict.fromkeys(t.split(",")[0] for t in blocks if ", greedy, K = " in t))
    lines = []
    for s in sets:
        k4 = next((b for t, b in blocks.items() if t.startswith(f"{s}, greedy, K = 4")), None)
        auto = next((b for t, b in blocks.items() if t == f"{s}, greedy, K = auto"), None)
        plain, main = read_block(k4 or auto)
        auto_rows = {r.name: r for r in read_rows(auto["drafters"])} if auto else {}
        lines += [
            f"{s}, plain decoding {plain.tokens_per_s:.1f} tokens/s"
            + ("" if k4 else " (scored at --k auto only)")
            + ":",
            "",
            "| drafter | τ (K = 4) | first-token acceptance | speedup (K = 4) | K chosen by --k auto | speedup there | "
            "greedy exact |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in main:
            a = auto_rows.get(d.name)
            chosen = f"{a.auto_k.k} | {a.speedup:.2f}×" if a else "– | –"
            fixed = f"{d.tau:.2f} | {d.accept_at[0]:.2f} | {d.speedup:.2f}×" if k4 else "– | – | –"
            lines.append(f"| {d.name} | {fixed} | {chosen} | {d.greedy_exact}/{d.prompts} |")
        lines.append("")
    return "\n".join(
        [
            f"SmolLM2-135M-Instruct in {result['dtype']}"
            f"{' (batch-invariant)' if result.get('batch_invariant') else ''}, greedy, {result['num_prompts']} "
            f"prompts × {result['max_new_tokens']} new tokens; every speedup is over plain decoding of the same target, "
            "interleaved prompt by prompt in the same run.",
            "",
            *lines,
            source(result),
        ]
    )


def scaling_headline(name: str = "scaling") -> str:
    """The README's headline from the data-scaling benchmark: the drafters of its largest subset on each held-out set,
    greedy at K = 4 and at ``--k auto``'s K, and sampled (T 0.7), every speedup over plain decoding of the same target
    (its dtype as the benchmark ran it) in the same run; then τ at K = 4 per subset size (the curve)."""
    from draftsmith.eval.rows import read_block, read_rows

    result = load(name)
    blocks, rows = result["blocks"], result["rows"]
    largest = max(r["tokens"] for r in rows)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    size_label = max(blocks, key=importlib.import_module("scaling_report").block_size).rsplit(" ", 1)[1]
    lines = []
    for s in ("mt-bench", "chat-heldout"):
        greedy, auto, sampled = (blocks.get(f"{s} {mode} {size_label}") for mode in ("greedy", "auto", "sampled"))
        if greedy is None:
            continue
        plain, greedy_rows = read_block(greedy)
        auto_rows = {r.name: r for r in read_rows(auto["drafters"])} if auto else {}
        sampled_rows = {r.name: r for r in read_rows(sampled["drafters"])} if sampled else {}
        lines += [
            f"{s}, plain decoding {plain.tokens_per_s:.1f} tokens/s:",
            "",
            "| drafter | τ (K = 4) | first-token acceptance | speedup (K = 4) | K chosen by --k auto | speedup there | "
            + "sampled T 0.7, K = 4 | " * bool(sampled)
            + "greedy exact |",
            "|---|---|---|---|---|---|---|" + "---|" * bool(sampled),
        ]
        for d in greedy_rows:
            a, t = auto_rows.get(d.name), sampled_rows.get(d.name)
            lines.append(
                f"| {d.name} | {d.tau:.2f} | {d.accept_at[0]:.2f} | {d.speedup:.2f}× | "
                + (f"{a.auto_k.k} | {a.speedup:.2f}×" if a else "– | –")
                + ((f" | {t.speedup:.2f}× (τ {t.tau:.2f})" if t else " | –") if sampled else "")
                + f" | {d.greedy_exact}/{d.prompts} |"
            )
        lines.append("")
    curve = ["| family | " + " | ".join(f"{x:,} tokens" for x in sorted({r["tokens"] for r in rows})) + " |"]
    curve.append("|---|" + "---|" * len({r["tokens"] for r in rows}))
    for s in ("mt-bench", "chat-heldout"):
        for f in dict.fromkeys(r["family"] for r in rows):
            cells = {r["tokens"]: r for r in rows if r["set"] == s and r["family"] == f}
            if cells:
                curve.append(
                    f"| {f}, {s} | "
                    + " | ".join(
                        f"τ {cells[x]['tau']:.2f}, {cells[x]['speedup']:.2f}×" if x in cells else "–"
                        for x in sorted({r["tokens"] for r in rows})
                    )
                    + " |"
                )
    c = result["corpus"]
    return "\n".join(
        [
            f"SmolLM2-135M-Instruct in {result['target'].rsplit(':', 1)[-1]} (batch-invariant), drafters trained on "
            f"{largest:,} generated tokens of "
            f"its own answers (a {c.get('generated_tokens', 0):,}-token corpus), {result['args']['num_prompts']} "
            f"held-out prompts × {result['args']['score_tokens']} new tokens per set; every speedup is over plain "
            "decoding of the same target, interleaved prompt by prompt in the same run.",
            "",
            *lines,
            "Greedy τ at K = 4 and speedup by training data (nested subsets of the corpus):",
            "",
            *curve,
            "",
            source(result),
        ]
    )


def recipe_headline(names: str = "recipe_smollm2") -> str:
    """The README's best trained drafter: each recipe report's winner (``recipe.winner``) beside the n-gram of the
    same blocks, per machine and held-out set: greedy at K = 4 (τ, first-token acceptance, speed over the block's
    fastest plain decoding and over the n-gram), at ``--k auto``'s K, and sampled at T 0.7 (over plain decoding of the
    same target: sampled blocks decode no reference); "–" where the report has no such block for it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    recipe = importlib.import_module("recipe")
    lines = [
        "| CPU | set | drafter | τ (K = 4) | first-token acc. | × fastest plain (K = 4) | × n-gram (K = 4) | "
        "K by --k auto: × fastest plain | sampled T 0.7, K = 4: speedup (τ) | greedy exact |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sources = []
    for name in names.split(","):
        result = load(name)
        best = recipe.winner(result["blocks"], list(result["fits"]))
        m = result["machine"]
        cpu = f"{m['cpu']} ({', '.join(f for f in m['cpu_flags'] if 'bf16' in f)})"
        by_mode = recipe.decoded_by(result, best)
        for set_name in recipe.SETS:
            if (set_name, "greedy") not in by_mode:
                continue
            plain, greedy = by_mode[set_name, "greedy"]
            for drafter in (best, "ngram"):
                g = greedy[drafter]
                auto = by_mode.get((set_name, "auto"), (None, {}))
                a = auto[1].get(drafter)
                t = by_mode.get((set_name, "sampled"), (None, {}))[1].get(drafter)
                lines.append(
                    f"| {cpu} | {set_name} | {drafter} | {g.tau:.2f} | {g.accept_at[0]:.2f} | "
                    f"{g.tokens_per_s / plain.fastest.tokens_per_s:.2f}× | "
                    + (f"{g.tokens_per_s / greedy['ngram'].tokens_per_s:.2f}× | " if drafter != "ngram" else "– | ")
                    + (f"{a.auto_k.k}: {a.tokens_per_s / auto[0].fastest.tokens_per_s:.2f}× | " if a else "– | ")
                    + (f"{t.speedup:.2f}× ({t.tau:.2f}) | " if t else "– | ")
                    + f"{g.greedy_exact}/{g.prompts} |"
                )
        fastest = {n for plain, _ in by_mode.values() for n in (plain.references or {})}
        sources.append(
            f"- {cpu}: the fastest plain decoding is the fastest in the same run of the {result['dtype']} target "
            f"draftsmith verifies with, {' and '.join(sorted(fastest))}; {result['prompts']} prompts × "
            f"{result['max_new_tokens']} new tokens per set. {source(result)}"
        )
    return "\n".join([*lines, "", *sources])


def verification_cost(name: str = "bf16_target") -> str:
    """r(m) per target dtype and kernel choice: what verifying m tokens costs in decoding steps."""
    result = load(name)
    ms = sorted({k for row in result["r"].values() for k in row if k != "step_ms"}, key=lambda k: int(k[2:-1]))
    lines = ["| target | decode step | " + " | ".join(ms) + " |", "|---|---|" + "---|" * len(ms)]
    for target, row in result["r"].items():
        lines.append(f"| {target} | {row['step_ms']:.1f} ms | " + " | ".join(f"{row[m]:.2f}" for m in ms) + " |")
    return "\n".join([*lines, "", source(result)])


def block(spec: str) -> str:
    """``NAME#TITLE``: the verifier's table of the block titled TITLE in ``NAME.json`` (a ``real_target`` run)."""
    from draftsmith.eval.report import markdown_table
    from draftsmith.eval.rows import read_block

    name, _, title = spec.partition("#")
    result = load(name)
    if title not in result["blocks"]:
        raise SystemExit(f"tables: {name}.json has no block {title!r} (blocks: {', '.join(result['blocks'])})")
    plain, rows = read_block(result["blocks"][title])
    return "\n".join([markdown_table(rows, plain), "", source(result)])


def by_block(name: str) -> str:
    """τ (speedup) of each drafter in every block of ``NAME.json`` but the first, one column per block."""
    from draftsmith.eval.rows import read_rows

    result = load(name)
    titles = list(result["blocks"])[1:]
    blocks = {t: {d.name: d for d in read_rows(result["blocks"][t]["drafters"])} for t in titles}
    names = list(dict.fromkeys(n for t in titles for n in blocks[t]))
    lines = ["| drafter | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for n in names:
        rows = [blocks[t].get(n) for t in titles]
        cells = [f"{r.tau:.2f} ({r.speedup:.2f}×)" if r else "–" for r in rows]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", source(result)])


def engines(names: str = "generate_engines,generate_engines_smollm2,generate_engines_smollm2_bfloat16") -> str:
    """The generate stage's tokens/s per engine, target and dtype: the best batch size of each engine per run."""
    lines = [
        "| target | dtype | sampling | new tokens | HF (batch) | vLLM (max_num_seqs) | vLLM / HF |",
        "|---|---|---|---|---|---|---|",
    ]
    sources = []
    for name in names.split(","):
        result = load(name)
        args, best = result["args"], {}
        for row in result["rows"]:
            engine = row["engine"].split()[0]
            if row["generation_tokens_per_s"] > best.get(engine, {}).get("generation_tokens_per_s", -1):
                best[engine] = row
        dtype = next(iter(best.values())).get("dtype", "float32")  # runs before the dtype column were float32
        sampling = f"T {args.get('temperature', 1.0)}, top-p {args.get('top_p', 1.0)}"
        cells = [f"{best[e]['generation_tokens_per_s']:,.0f} tok/s ({best[e]['batch_size']})" for e in ("hf", "vllm")]
        ratio = best["vllm"]["generation_tokens_per_s"] / best["hf"]["generation_tokens_per_s"]
        lines.append(
            f"| {args['target_name']} | {dtype} | {sampling} | {args['max_new_tokens']} | {cells[0]} | {cells[1]} | "
            f"{ratio:.2f}× |"
        )
        sources.append(f"- {args['target_name']}, {dtype}: {source(result)}")
    return "\n".join([*lines, "", *sources])


def heads(name: str) -> str:
    """``NAME.json`` (a ``heads.py`` run): each block's summary, τ and speedup per family as a chain and in trees."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from draftsmith.eval.rows import read_block

    summary = importlib.import_module("heads").summary
    result = load(name)
    lines = []
    for title, b in result["blocks"].items():
        plain, rows = read_block(b)
        lines += [f"{title}, plain decoding {plain.tokens_per_s:.1f} tokens/s:", "", *summary(rows), ""]
    return "\n".join([*lines, source(result)])


BASELINE_PAIRS = {
    "plain decoding / HF `generate`": ("draftsmith plain", "HF generate"),
    "draft LM, K = 4 / HF assisted, K = 4 constant, no threshold": ("draftsmith draft LM", "HF assisted, constant K"),
    "draft LM, `confidence:0.4` / HF assisted with its defaults (≤ 20 tokens, threshold 0.4)": (
        "draftsmith draft LM, confidence 0.4",
        "HF assisted, HF defaults",
    ),
    "n-gram, N = 3 / HF prompt lookup, N = 3": ("draftsmith n-gram", "HF prompt lookup"),
}
"""draftsmith's row and HF's row compared in each line of the baselines table."""


def baselines(names: str = "baselines,baselines_smollm2") -> str:
    """draftsmith's decoding loops against HF transformers' on the same work: the tokens/s ratio of each pair, τ
    beside it (tokens per target forward), one column per target."""
    results = [load(n) for n in names.split(",")]
    head = " | ".join(f"{r['target']} ({r['num_prompts']} prompts × {r['repeats']})" for r in results)
    lines = [f"| pair | {head} |", "|---|" + "---|" * len(results)]
    for label, (ours, theirs) in BASELINE_PAIRS.items():
        cells = []
        for r in results:
            a, b = r["rows"][ours], r["rows"][theirs]
            ratio = a["tokens_per_s"] / b["tokens_per_s"]
            same = f"{a['tau']:.2f}" == f"{b['tau']:.2f}"
            tau = f" (τ {a['tau']:.2f} both)" if same else f" (τ {a['tau']:.2f} vs {b['tau']:.2f})"
            cells.append(f"{ratio:.2f}×" + ("" if ours == "draftsmith plain" else tau))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *(f"- {r['target']}: {source(r)}" for r in results)])


def result(name: str) -> str:
    """``NAME``'s Markdown as its benchmark's ``markdown(result)`` writes it (``MARKDOWN``), headings one level down
    and its title dropped, with the line saying what measured it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    text = importlib.import_module(MARKDOWN[name]).markdown(load(name)).strip().splitlines()
    body = [("#" + line if line.startswith("#") else line) for line in text[1:]]
    return "\n".join([*body, "", source(load(name))]).strip()


TABLES = {
    "engines": engines,
    "result": result,
    "headline": headline,
    "scaling_headline": scaling_headline,
    "recipe_headline": recipe_headline,
    "verification_cost": verification_cost,
    "block": block,
    "by_block": by_block,
    "heads": heads,
    "baselines": baselines,
}
"""Block name -> its table (a function of the results' JSON)."""


def results_markdown() -> dict[Path, str]:
    """``benchmarks/results/NAME.md`` as its benchmark's ``markdown`` writes it from ``NAME.json``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    out = {}
    for name, module in MARKDOWN.items():
        if (RESULTS / f"{name}.json").is_file():
            out[RESULTS / f"{name}.md"] = importlib.import_module(module).markdown(load(name))
    return out


def render(text: str) -> str:
    """``text`` with every ``<!-- table:NAME -->`` block rebuilt."""

    def block(m: re.Match) -> str:
        kind, _, arg = m.group(2).partition(":")
        if kind not in TABLES:
            raise SystemExit(f"tables: unknown table {kind!r} (known: {', '.join(TABLES)})")
        table = TABLES[kind](arg) if arg else TABLES[kind]()
        return f"{m.group(1)}{table}\n{m.group(4)}"

    return BLOCK.sub(block, text)


CURVES = {"smollm2": ("scaling_families", ("recipe_smollm2_250k", "recipe_smollm2"))}
"""Recipe set -> the results whose learning curves ``draftsmith pipeline`` predicts τ from
(``draftsmith/configs/SET/learning_curve.json``, which ``draftsmith learning-curve`` writes from them): the
data-scaling study's, and the recipe study's reports (their rows of a pipeline family at two or more data budgets,
e.g. EAGLE-3.1 at 250k and 1M, per number of passes)."""


def learning_curves() -> dict[Path, str]:
    """Per recipe set of ``CURVES``: its learning curves as ``draftsmith learning-curve`` writes them from the
    results (``train.learning_curve.measured_curves``), in the file the package reads them from."""

    def report(name: str) -> tuple[str, dict]:
        return f"benchmarks/results/{name}.json", load(name)

    out = {}
    for recipes, (name, reports) in CURVES.items():
        out[curves_file(recipes)] = measured_curves(recipes, report(name), [report(r) for r in reports]).text()
    return out


def expected() -> dict[Path, str]:
    """Every file with generated tables, as it should read."""
    out = results_markdown() | learning_curves()
    for path in DOCS:
        text = path.read_text()
        if BLOCK.search(text):
            out[path] = render(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file differs")
    args = parser.parse_args()
    stale = []
    for path, text in expected().items():
        if not path.is_file() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(text)
    verb = "differ from their JSON" if args.check else "rewritten"
    print(f"{len(stale)} file(s) {verb}: {', '.join(map(str, stale)) or '-'}")
    if args.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
