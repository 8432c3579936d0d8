"""RASD in ``score`` and ``generate``: ``--k auto`` sizes the fused tree from r(m) and the drafter's cost (retrieval's
latency inside it), and ``generate --datastore`` indexes the corpus it writes."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conftest import make_llama
from test_rasd import repetitive

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.shards import load_generated
from draftsmith.decode.verifier import plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval import calibration, score
from draftsmith.families.rasd import budget as eval_rasd
from draftsmith.families.rasd.drafter import RasdDrafter
from draftsmith.families.rasd.retrieval import SuffixIndex
from draftsmith.families.specs import load_drafter
from draftsmith.layers.causal_lm import DraftLM

pytestmark = pytest.mark.usefixtures("one_thread")


def fused_drafter(target: Target, prompts: list[list[int]], datastore=SuffixIndex) -> RasdDrafter:
    """A draft LM that mostly disagrees with ``target``, fused with a datastore holding how the prompts go on."""
    known = [p + plain_decode(target, p, 24, Sampling()).tokens for p in prompts]
    return RasdDrafter(DraftLM(make_llama(seed=5, layers=1)), datastore=datastore.build(known), prune_top_k=0)


def machine(shape, monkeypatch) -> list[dict]:
    """This machine as ``score`` measures it, with r(m) = ``shape(m)`` and a decode step of 1000 s (the drafter's
    own time then costs nothing): the r each measurement returned, one dict per call."""
    seen = []

    def verify_ratios(target, prompt, counts, repeats=7):
        seen.append({m: shape(m) for m in {1, *counts}})
        return seen[-1], 1e3

    monkeypatch.setattr(calibration, "verify_ratios", verify_ratios)
    return seen


@pytest.mark.parametrize(
    ("shape", "name"), [(lambda m: 1.0, "flat"), (lambda m: 10.0 ** (m - 1), "steep")], ids=["flat", "steep"]
)
def test_k_auto_sizes_the_fused_tree_from_r_and_decodes_exactly(target, monkeypatch, shape, name):
    prompts = repetitive(0)
    drafter = fused_drafter(target, prompts)
    measured = machine(shape, monkeypatch)
    _, [row] = score.score_drafters(target, {"fused": drafter}, prompts, "auto", Sampling(), 24, progress=False)
    auto = row.auto_k
    assert auto.nodes == drafter.nodes and row.k == auto.k
    assert row.greedy_exact == len(prompts)  # greedy output equals plain greedy at the chosen shape
    model_k = max(auto.candidates, key=lambda c: c["speedup"])["k"]  # the draft LM's K alone
    by = {(c["k"], c["nodes"]): c for c in auto.nodes_candidates}
    assert set(by) == {(k, n) for k in {model_k, 4, 8} for n in eval_rasd.BUDGETS}  # its K and deeper
    assert auto.model_depth == model_k  # the model drafts at its own K; retrieval goes deeper
    deepest = {model_k + 1 + n for n in eval_rasd.BUDGETS}  # the model's chain, the root and each retrieval budget
    [ratios] = [r for r in measured if deepest <= set(r)]  # r(m) measured up to the widest fused tree
    ms = sorted(ratios)
    for c in auto.nodes_candidates:  # each prediction is τ / (r(m) + C): r linear between the measured m, C ~ 0
        r = float(np.interp(c["verified"], ms, [ratios[m] for m in ms]))  # against a 1000 s step
        assert 0 <= c["cost"] < 1e-3 and c["speedup"] == pytest.approx(c["tau"] / r, rel=1e-3)
    assert auto.predicted_speedup == by[auto.k, auto.nodes]["speedup"]
    top = max(c["speedup"] for c in auto.nodes_candidates)  # within the chooser's tie (the smaller shape wins a tie:
    assert auto.predicted_speedup >= top * (1 - 1e-9)  # shapes drafting the same tokens differ by the clock alone)
    assert auto.predicted_tau == by[auto.k, auto.nodes]["tau"]
    assert by[8, 32]["tau"] > by[8, 0]["tau"]  # retrieval drafts what the draft LM misses
    if name == "flat":  # verifying is free: the deepest, widest tree that commits the most per round
        assert auto.nodes > 0 and by[auto.k, auto.nodes]["tau"] == max(c["tau"] for c in auto.nodes_candidates)
    else:  # each verified token costs ten times more: no retrieval node, no second draft token pays for itself
        assert auto.nodes == 0 and model_k == 1
    saved = row.to_dict()["auto_k"]
    assert saved["nodes"] == auto.nodes and saved["nodes_candidates"] == auto.nodes_candidates
    assert type(row).from_dict(row.to_dict()).to_dict() == row.to_dict()  # a saved report's row reads back


class SlowIndex(SuffixIndex):
    """A datastore whose every lookup takes 10 ms more (a large corpus on a slow disk)."""

    def lookup(self, *args, **kwargs):
        time.sleep(0.01)
        return super().lookup(*args, **kwargs)


def test_retrieval_latency_is_reported_per_round_and_counted_in_the_drafters_cost(target):
    prompts = repetitive(0)
    drafter = fused_drafter(target, prompts, SlowIndex)
    plain, [row] = score.score_drafters(target, {"fused": drafter}, prompts, 4, Sampling(), 16, progress=False)
    assert row.greedy_exact == len(prompts)
    assert row.extra["retrieval_ms_per_round"] >= 10
    step = plain.seconds / plain.target_calls
    assert row.cost_ratio * row.mean_drafted * step >= 0.01  # the drafter's time per round holds the lookup's
    assert row.extra["retrieval_nodes_per_round"] > 0 and 0 < row.extra["accepted_from_retrieval"] <= 1
    assert calibration.most_verified(drafter, 4) == 5 + drafter.nodes  # r is measured up to the widest fused tree


def test_generate_builds_the_datastore_beside_the_corpus_on_request(tmp_path, model_dirs, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "w{i} w{i + 1} w{i + 2}"}}\n' for i in range(0, 20, 5)))
    common = ["--target", str(model_dirs["target"]), "--prompts", str(prompts), "--temperature", "0"]
    common += ["--max-new-tokens", "12", "--device", "cpu"]
    main(["generate", *common, "--out", str(tmp_path / "plain")])
    assert not (tmp_path / "plain.datastore").exists()  # off by default
    capsys.readouterr()
    main(["generate", *common, "--out", str(tmp_path / "gen"), "--datastore"])
    printed = capsys.readouterr().out
    store = tmp_path / "gen.datastore"
    assert f"{store}: 4 rows" in printed and " MB, built in " in printed  # its size and build time
    dataset, meta = load_generated(tmp_path / "gen")
    index, info = SuffixIndex.load(store, meta["target"])
    assert info["fingerprint"] == meta["target"] and info["fingerprint"]["tokenizer_hash"]
    assert info["rows"] == 4 and len(index) == sum(len(r) + 1 for r in dataset["input_ids"])
    # asked again on the complete corpus, it builds the datastore without generating
    main(["generate", *common, "--out", str(tmp_path / "plain"), "--resume", "--datastore"])
    assert "nothing to do" in capsys.readouterr().out and (tmp_path / "plain.datastore" / "datastore.json").is_file()
    # a target with another tokenizer is refused in one line naming the datastore
    foreign = Target.from_pretrained(model_dirs["foreign"])
    with pytest.raises(DraftsmithError, match=f"datastore {store} was made for target .*tokenizer_hash") as e:
        load_drafter(f"rasd:datastore={store}:target", foreign)
    assert "\n" not in str(e.value)
    with pytest.raises(SystemExit):
        main(["score", "--target", str(model_dirs["foreign"]), "--drafter", f"rasd:datastore={store}:target",
              "--prompts", str(prompts), "--out", str(tmp_path / "s")])  # fmt: skip
    err = capsys.readouterr().err  # the target's loading bars, then one line
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        f"draftsmith: error: datastore {store} was made for target"
    )


def test_score_k_auto_records_and_prints_the_fused_trees_budget(tmp_path, model_dirs, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2 w3 w1 w2 w3 w1 w2"}\n{"prompt": "w5 w6 w7 w5 w6 w7 w5"}\n')
    main(["generate", "--target", str(model_dirs["target"]), "--prompts", str(prompts), "--temperature", "0",
          "--max-new-tokens", "16", "--device", "cpu", "--out", str(tmp_path / "gen"), "--datastore"])  # fmt: skip
    capsys.readouterr()
    spec = f"fused=rasd:datastore={tmp_path / 'gen.datastore'},prune=0:{model_dirs['drafter']}"
    main(["score", "--target", str(model_dirs["target"]), "--drafter", spec, "--prompts", str(prompts),
          "--k", "auto", "--max-new-tokens", "16",
          "--out", str(tmp_path / "score")])  # fmt: skip
    printed = capsys.readouterr().out
    [row] = json.loads((tmp_path / "score" / "report.json").read_text())["drafters"]
    assert row["greedy_exact"] == 2 and row["auto_k"]["nodes"] in eval_rasd.BUDGETS
    assert row["retrieval_ms_per_round"] > 0 and row["accepted_from_retrieval"] > 0
    _, line = [x for x in printed.splitlines() if x.startswith("| fused | ")]  # the scores, then --k auto's choice
    assert "| retrieval nodes |" in printed and f"| {row['auto_k']['k']} | – | {row['auto_k']['nodes']} |" in line
    md = (tmp_path / "score" / "report.md").read_text()
    assert "## Retrieval (RASD)" in md and "| retrieval nodes |" in md
    best = max(c["speedup"] for c in row["auto_k"]["nodes_candidates"])
    assert row["auto_k"]["predicted_speedup"] == pytest.approx(best, abs=1e-4)
