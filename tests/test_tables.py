"""The result tables in the README, ``docs/`` and ``benchmarks/results/*.md`` are the ones their JSON gives
(``python benchmarks/tables.py`` writes them): a figure typed in by hand, or left behind when a benchmark reran, fails."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tables  # noqa: E402


@pytest.fixture(scope="module")
def expected() -> dict[Path, str]:
    return tables.expected()


def test_every_generated_table_matches_its_json(expected):
    stale = [str(p.relative_to(tables.ROOT)) for p, text in expected.items() if p.read_text() != text]
    assert not stale, f"run python benchmarks/tables.py: {stale}"
    assert tables.ROOT / "README.md" in expected  # the README's headline is generated
    assert tables.RESULTS / "scaling.md" in expected


def test_a_figure_edited_by_hand_is_caught(expected):
    readme = expected[tables.ROOT / "README.md"]
    start = readme.index("<!-- table:recipe_headline")
    row = next(line for line in readme[start:].splitlines() if "| ngram |" in line)
    edited = readme.replace(row, row.replace("×", "0×", 1))
    assert edited != readme and tables.render(edited) == readme
    # a results file is its benchmark's Markdown of its JSON: change the JSON and the expected Markdown follows
    data = tables.load("bf16_target")
    plain = data["sets"]["chat-heldout"]["plain"]["bf16 batch-invariant"]
    before = tables.importlib.import_module("bf16_target").markdown(data)
    plain["tokens_per_s"] += 10.0
    after = tables.importlib.import_module("bf16_target").markdown(data)
    assert (
        f"| {plain['tokens_per_s']:.1f} |" in after and after != before == expected[tables.RESULTS / "bf16_target.md"]
    )


def test_an_unknown_table_name_is_refused():
    with pytest.raises(SystemExit, match="unknown table 'nosuch'"):
        tables.render("<!-- table:nosuch -->\n<!-- /table -->")


def test_recipe_headline_puts_each_reports_winner_beside_the_ngram_of_its_own_blocks(tmp_path, monkeypatch):
    from draftsmith.eval.rows import read_block

    recipe = tables.importlib.import_module("recipe")
    data = tables.load("recipe_smollm2")
    best = recipe.winner(data["blocks"], list(data["fits"]))
    plain, rows = read_block(data["blocks"][f"chat-heldout greedy +{best}"])
    row, ngram = (next(r for r in rows if r.name == n) for n in (best, "ngram"))
    line = next(x for x in tables.recipe_headline("recipe_smollm2").splitlines() if f"| chat-heldout | {best} |" in x)
    assert f"| {row.tau:.2f} | {row.accept_at[0]:.2f} | {row.tokens_per_s / plain.fastest.tokens_per_s:.2f}× |" in line
    assert f"| {row.tokens_per_s / ngram.tokens_per_s:.2f}× |" in line
    # the same report with that drafter ten times slower: the headline names the report's new winner instead
    for block in data["blocks"].values():
        for d in block["drafters"]:
            if d["name"] == best:
                d["tokens_per_s"], d["speedup"] = d["tokens_per_s"] / 10, d["speedup"] / 10
    (tmp_path / "other.json").write_text(tables.json.dumps(data))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    headline, now = tables.recipe_headline("other"), recipe.winner(data["blocks"], list(data["fits"]))
    assert f"| {best} |" not in headline and now != best and f"| chat-heldout | {now} |" in headline


def test_scaling_report_checks_the_papers_orderings_on_the_large_subsets():
    report = tables.importlib.import_module("scaling_report")
    data = tables.load("scaling")
    big = [r for r in data["rows"] if r["family"] == "eagle3" and r["size"] >= report.ORDERED_FROM]
    assert big and not report.orderings(data["rows"])  # EAGLE-3 alone: nothing to order
    worse = [{**r, "family": "eagle1", "tau": r["tau"] - 0.1} for r in big]
    better = [{**r, "family": "eagle1", "tau": r["tau"] + 0.1} for r in big]
    small = [{**r, "family": "medusa1", "size": 100_000} for r in data["rows"] if r["size"] == 100_000]
    held = report.orderings(data["rows"] + worse + small)
    assert len(held) == len(big) and all(o["holds"] and o["above"] == "eagle3" for o in held)
    assert not any(o["holds"] for o in report.orderings(data["rows"] + better))
    text = report.markdown(
        {**data, "rows": data["rows"] + better, "orderings": report.orderings(data["rows"] + better)}
    )
    assert "eagle3 τ" in text and "does not hold" in text and "![scaling](scaling.png)" in text
    scaling = tables.importlib.import_module("scaling")
    assert scaling.results_name("smollm2:float32") == "scaling_float32"
    assert not scaling.trained_at("hydra", 1_000_000, [1_000_000])
    # the study's rows on the largest subset asked for: 1M by default, 250k in an ablation run of that size alone
    assert scaling.trained_at("eagle3_31_ttt7", 250_000, [250_000])
    assert not scaling.trained_at("eagle3_31_ttt7", 250_000, [250_000, 1_000_000])
    assert scaling.untrained(["eagle3_31", "hydra", "eagle3"], [250_000]) == ["hydra"]  # refused, not skipped


def test_scaling_report_carries_over_an_earlier_run_only_of_the_same_corpus():
    report = tables.importlib.import_module("scaling_report")
    data = tables.load("scaling")
    recorded = {r["size"]: (r["rows"], r["tokens"]) for r in data["rows"]}
    small, big = min(recorded), max(recorded)
    prefix = {small: recorded[small], big: (recorded[small][0] + 1, recorded[small][1] + 50)}  # holds `small` whole
    prior = report.earlier_run(prefix, "scaling")
    first = f"{data['machine']['git']} {data['machine']['date']}"
    assert prior and [r["run"] for r in prior["rows"]] == [r.get("run", first) for r in data["rows"]]
    assert report.earlier_run({small: (recorded[small][0] + 1, recorded[small][1])}, "scaling") is None  # another
    assert (
        report.earlier_run({big: prefix[big]}, "scaling") is None
    )  # no subset both hold: nothing shows it is the same
    assert report.earlier_run(prefix, "nosuch") is None
    again = {"rows": 1792, "generated_tokens": 360_000, "tokens_per_s": 200.0}
    text = report.markdown({**prior, "corpus": prior["corpus"] | {"regenerated": again}})
    assert "generated its first 1792 answers again" in text and f"| {prior['rows'][0]['run']} |" in text
    assert report.block_size("mt-bench greedy 1M") == 1_000_000 and report.block_size("mt-bench auto 22k") == 22_000


def test_scaling_curve_fits_log_linear_growth_and_names_where_returns_diminish():
    report = tables.importlib.import_module("scaling_report")
    assert report.fit_curve([(1e5, 1.3)]) is None  # one point: no curve
    line = [(t, 1.0 + 0.1 * math.log2(t / 1e4)) for t in (1e4, 2e4, 4e4, 8e4)]  # 0.1 τ per doubling, no bend
    curve = report.fit_curve(line)
    assert curve["gain_per_doubling"] == pytest.approx(0.1, abs=1e-4) and curve["diminishing_from"] is None
    assert curve["tokens_for_goal"] == pytest.approx(1e4 * 2 ** ((report.GOAL_TAU - 1.0) / 0.1), rel=1e-3)
    bent = [(1e4, 1.0), (2e4, 1.2), (4e4, 1.25), (8e4, 1.27)]  # 0.2, then 0.05 per doubling
    assert report.fit_curve(bent)["diminishing_from"] == 2e4
    rising = [(1e4, 1.0), (2e4, 1.01), (4e4, 1.2), (8e4, 1.4)]  # a slow first doubling is not diminishing returns
    curve = report.fit_curve(rising)
    assert curve["diminishing_from"] is None
    assert curve["tokens_for_goal_last"] == pytest.approx(8e4 * 2 ** ((report.GOAL_TAU - 1.4) / 0.2), rel=1e-3)
    assert report.fit_curve([(1e4, 1.3), (2e4, 1.2)])["tokens_for_goal"] is None  # falling: never reaches it


def test_scaling_rescores_a_block_with_the_drafters_it_held_and_those_asked():
    block_names = tables.importlib.import_module("scaling").block_names
    held = ["eagle3-300k", "eagle1-300k", "peagle-300k"]
    heads = ["medusa1-300k", "hydra-300k", "hydrapp-300k"]
    assert block_names(heads, held) == held + heads
    assert block_names(["eagle3-300k", "medusa1-300k"], held) == held + ["medusa1-300k"]
    assert block_names(heads, []) == heads
    assert block_names(["eagle1-1M", "ngram"], ["eagle3-1M", "ngram"]) == ["eagle3-1M", "eagle1-1M", "ngram"]
