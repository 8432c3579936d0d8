"""Falcon: k tokens per drafter forward, a training forward that computes what drafting computes, CSGD training
that raises an estimate equal to the verifier's τ, and a verifier that stays exact (greedy) and lossless (sampling)."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch
from conftest import make_llama
from test_train import setup, trainer  # noqa: F401 - module fixture: tiny target and its data
from test_trees import soft_target  # noqa: F401 - module fixture: a soft 8-token target
from test_verifier import SMALL_V, chi_square_pvalue, later_pair_distribution

from draftsmith.cli import main
from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.falcon.module import FalconModule
from draftsmith.families.eagle.falcon.network import FalconConfig, FalconModel, block_mask
from draftsmith.families.eagle.network import EagleModel, ttt_mask
from draftsmith.families.registry import build_network, load_trained
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.tree_draft import TreePolicy
from draftsmith.train.data import GeneratedDataModule

pytestmark = pytest.mark.usefixtures("one_thread")

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "falcon.yaml"
CONTEXT = [3, 14, 15, 9, 26, 5, 7]
ACCURACY = [[0.5, 0.3, 0.1]] * 5  # made-up per-depth top-k accuracies for static trees


def build(target_model, block: int, seed: int = 0, sharpen: float = 1.0) -> FalconModel:
    """An untrained Falcon network for ``target_model``; ``sharpen`` scales its LM head copy (a confident
    drafter whose q is far from the target's p, what the chi-square tests need)."""
    torch.manual_seed(seed)
    net = FalconModel(FalconConfig.for_target(target_model.config, block))
    net.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
    net.lm_head.weight.data.mul_(sharpen)
    return net.eval()


def draft_from(drafter, target: Target, committed: list[int], k: int, sampling: Sampling, seed: int = 0) -> Draft:
    """A fresh ``begin`` on ``committed`` and one ``propose`` of depth k."""
    ids = torch.tensor(committed)
    state = drafter.begin(ids, target(ids[None]).positions(slice(0, len(committed) - 1)))
    return drafter.propose(state, k, sampling, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block", [1, 2, 3])
def test_training_forward_equals_drafting(tokenizer, block):
    """The teacher-forced unroll, fed the drafted tokens, gives every step's q of a drafted chain; from prefixes
    shorter than a block too (pad rows), and across block boundaries (depth 5)."""
    base = make_llama(seed=0)
    net = build(base, block)
    target = Target(base, tokenizer, (-1,))
    drafter = net.as_drafter()
    for n in (1, 2, 4, 6):  # committed CONTEXT[: n + 1]: the last anchor is n - 1
        draft = draft_from(drafter, target, CONTEXT[: n + 1], 5, Sampling(temperature=1.0))
        seq = torch.tensor([CONTEXT[: n + 1] + draft.tokens.tolist()])
        with torch.no_grad():
            steps = net.steps(seq, target(seq).features, torch.ones_like(seq), 5)
        for d, hidden in enumerate(steps):
            q = torch.softmax(net.logits(hidden[0, n - 1]), -1)
            torch.testing.assert_close(q, draft.q[d], atol=1e-5, rtol=1e-4)


def test_block_one_drafts_as_eagle1(tokenizer):
    base = make_llama(seed=0)
    falcon = build(base, 1)
    eagle = EagleModel(EagleConfig.from_target(base.config, 1, (-1,)))
    eagle.load_state_dict(falcon.state_dict())
    target = Target(base, tokenizer, (-1,))
    ours, theirs = (draft_from(m.eval().as_drafter(), target, CONTEXT, 4, Sampling(1.0)) for m in (falcon, eagle))
    assert ours.tokens.tolist() == theirs.tokens.tolist()
    torch.testing.assert_close(ours.q, theirs.q)


def test_block_mask_sees_earlier_blocks_and_its_own_block_only():
    assert torch.equal(block_mask(5, 1, 0, 2, None, "cpu"), ttt_mask(5, 2, None, "cpu"))
    mask = block_mask(4, 2, 1, 1, None, "cpu")[0, 0]  # blocks {0}, {1, 2}, {3}; pass 1 over passes 0 and 1
    assert mask[1].tolist() == [True, True, True, False] + [False, True, True, False]
    assert mask[3].tolist() == [True] * 4 + [False, False, False, True]


@pytest.mark.parametrize("block", [2, 3])
@pytest.mark.parametrize("tree", ["chain", "static", "dynamic"])
def test_greedy_with_falcon_equals_plain_greedy(tokenizer, prompts, block, tree):
    base = make_llama(seed=0)
    target = Target(base, tokenizer, (-1,))
    drafter = build(base, block).as_drafter(ACCURACY)
    drafter.set_tree(TreePolicy(TreeKind(tree), size=10, top_k=3), 5)
    for k in (1, 4, 5):
        decoder = SpeculativeDecoder(target, drafter, k, Sampling())
        for prompt in [[7], *prompts]:  # [7]: a prompt shorter than the block
            result = decoder.generate(prompt, 25)
            assert result.tokens == plain_decode(target, prompt, 25, Sampling()).tokens
            assert max(result.depth) <= k
        if tree != "chain":
            assert max(result.drafted) > max(result.depth)  # really trees


def test_one_drafter_forward_per_block_of_tokens(tokenizer, prompts):
    base = make_llama(seed=0)
    net = build(base, 2)
    calls = []
    net.layer.register_forward_hook(lambda *_: calls.append(1))
    target = Target(base, tokenizer, (-1,))
    result = SpeculativeDecoder(target, net.as_drafter(), 4, Sampling()).generate(prompts[0], 25)
    assert len(calls) == sum(-(-d // 2) for d in result.drafted) and max(result.drafted) == 4
    drafter = net.as_drafter(ACCURACY)
    for tree in ("chain", "dynamic"):  # depth 5 in blocks of 2: three forwards, whatever the tree's width
        drafter.set_tree(TreePolicy(TreeKind(tree), size=12, top_k=3), 5)
        calls.clear()
        draft = draft_from(drafter, target, CONTEXT, 5, Sampling())
        assert len(calls) == 3 and len(draft) >= 5


def sampled_later_pairs(target: Target, drafter, n: int = 1000) -> torch.Tensor:
    """Counts of (x2, x3): in one round, both tokens of one drafted block (the second from the same forward)."""
    decoder = SpeculativeDecoder(target, drafter, 2, Sampling(temperature=1.0))
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7)
    for _ in range(n):
        tokens = decoder.generate([1, 2, 3], 4, g).tokens  # x1 from the prefill, then a depth-2 round
        counts[tokens[1] * SMALL_V + tokens[2]] += 1
    return counts


@pytest.fixture(scope="module")
def soft_pair(soft_target):  # noqa: F811
    target = Target(soft_target.model, None, (-1,))
    with torch.no_grad():
        expected = later_pair_distribution(target, [1, 2, 3], Sampling(temperature=1.0))
    return target, expected


def test_sampling_with_falcon_chains_is_distributed_as_the_target(soft_pair):
    target, expected = soft_pair
    drafter = build(target.model, 2, sharpen=10.0).as_drafter()
    assert chi_square_pvalue(sampled_later_pairs(target, drafter), expected) > 1e-3


def test_chi_square_catches_a_falcon_draft_that_misreports_its_q(soft_pair, monkeypatch):
    """Each token of the block drawn from its own row's q but reported with the other row's q: biased."""
    target, expected = soft_pair
    drafter = build(target.model, 2, sharpen=10.0).as_drafter()
    honest = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: (lambda d: Draft(d.tokens, d.parents, d.q.flip(0)))(honest(*a)))
    assert chi_square_pvalue(sampled_later_pairs(target, drafter), expected) < 1e-3


def val_prompts(setup) -> list[list[int]]:  # noqa: F811
    rows = datasets.load_from_disk(str(setup["data-val"]))
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):  # noqa: F811
    """Falcon (block 2) trained 60 CSGD steps; validation before and after, and a native export."""
    torch.manual_seed(0)
    model = FalconModule(str(setup["target"]), block=2, optim=OptimConfig(lr=3e-3, warmup_steps=5))
    data = GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), batch_size=8, max_length=64)
    root = tmp_path_factory.mktemp("falcon")
    before = trainer(root, 0).validate(model, data, verbose=False)[0]
    trainer(root, 60).fit(model, data)
    after = trainer(root, 0).validate(model, data, verbose=False)[0]
    export = save_native(model.drafter, model.target, root / "native", {"topk_accuracy": model.topk_accuracy})
    return {"module": model, "before": before, "after": after, "export": export}


def test_csgd_training_lowers_the_loss_raises_tau_and_glances_less(trained):
    before, after = trained["before"], trained["after"]
    print({k: (round(before[k], 3), round(after[k], 3)) for k in before})
    assert after["val/loss"] < 0.8 * before["val/loss"]
    assert after["val/ce_1"] < before["val/ce_1"] - 0.3  # the pass reading its own block learns too
    assert after["val/tau_est"] > before["val/tau_est"] + 0.2
    assert after["val/glanced"] < before["val/glanced"]  # fewer errors, less ground truth shown


def test_tau_estimate_is_the_verifiers_and_save_load_keeps_drafts(trained, setup, tmp_path):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    model = trained["module"]
    loaded = load_trained(trained["export"], target)
    drafters = {"trained": model.drafter.as_drafter(), "loaded": loaded}
    scored = score_drafters(target, drafters, val_prompts(setup), 4, Sampling(0.0), 24, 0)[1]
    assert [row.greedy_exact for row in scored] == [len(val_prompts(setup))] * 2
    assert scored[0].tau_full == pytest.approx(trained["after"]["val/tau_est"], rel=1e-6)
    assert scored[0].tau > 1.3 and scored[1].tau == scored[0].tau
    context = val_prompts(setup)[0] + [1, 2]
    ours, theirs = (draft_from(d, target, context, 5, Sampling(1.0)) for d in drafters.values())
    assert ours.tokens.tolist() == theirs.tokens.tolist() and torch.equal(ours.q, theirs.q)
    assert loaded.topk_accuracy == model.topk_accuracy and len(model.topk_accuracy) == 4
    net = build(target.model, 3, seed=1)  # not the default block: the record carries it
    again = load_trained(save_native(net, target, tmp_path / "block3"), target)
    assert again.model.cfg.block == 3
    ours, theirs = (draft_from(d, target, context, 5, Sampling(1.0)) for d in (net.as_drafter(), again))
    assert ours.tokens.tolist() == theirs.tokens.tolist() and torch.equal(ours.q, theirs.q)


def test_static_tree_from_measured_accuracies_accepts_more_than_a_chain(trained, setup):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    chain, tree = (load_trained(trained["export"], target) for _ in range(2))
    tree.set_tree(TreePolicy(TreeKind.STATIC, size=10), 4)
    rows = score_drafters(target, {"chain": chain, "static": tree}, val_prompts(setup), 4, Sampling(0.0), 24, 0)[1]
    assert all(r.greedy_exact == len(val_prompts(setup)) for r in rows)
    assert rows[1].tau > rows[0].tau


def test_glancing_shows_a_share_of_truth_proportional_to_errors(setup):  # noqa: F811
    model = FalconModule(str(setup["target"]), block=2, glance=1.0).eval()
    wrong = torch.tensor([[True, True, True, False, False, False]] * 400)  # alignment 0: blocks {0,1} {2,3} {4,5}
    share = model._glanced(wrong, 0).float().mean(0)
    assert share[:2].tolist() == [1, 1] and share[4:].tolist() == [0, 0]  # all wrong: all truth; none: none
    assert torch.allclose(share[2:4], torch.tensor(0.5), atol=0.1)  # one error of two: half


@pytest.mark.parametrize(("kwargs", "message"), [({"block": 0}, "model.block must be at least 1, got 0"),
                                                 ({"glance": -1.0}, "model.glance must be at least 0")])  # fmt: skip
def test_bad_settings_are_one_line_errors(setup, tmp_path, capsys, kwargs, message):  # noqa: F811
    with pytest.raises(DraftsmithError, match=message):
        FalconModule(str(setup["target"]), **kwargs)
    key, value = next(iter(kwargs.items()))
    with pytest.raises(SystemExit) as exc:
        main(["fit", f"--config={RECIPE}", f"--model.init_args.target={setup['target']}",
              f"--model.init_args.{key}={value}", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DraftsmithError, match="falcon: block must be at least 1, got 0"):
        build_network("falcon", {"block": 0})  # a native record with a bad block
