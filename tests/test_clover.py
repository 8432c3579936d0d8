"""Clover: it learns, its estimate is the verifier's τ, its training forward is its drafting, greedy decoding stays
exact (chains and trees), sampling stays lossless, save/load keeps its drafts, and bad settings are one line."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch
from conftest import make_llama
from test_train import setup, trainer  # noqa: F401 - module fixture: tiny target and its data
from test_trees import soft_target  # noqa: F401 - module fixture: a soft 8-token target
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution

from draftsmith.cli import main
from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.data.generate import generate
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.clover.module import CloverModule
from draftsmith.families.clover.network import CloverConfig, CloverModel
from draftsmith.families.registry import load_trained
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.tree_draft import TreePolicy
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
OPTIM = OptimConfig(lr=3e-3, warmup_steps=5)
CONTEXT = [3, 14, 15, 9, 26, 5, 7, 40, 2]


def randomize(net: CloverModel, seed: int = 0, sharpen: float = 1.0) -> CloverModel:
    """Noise on every trainable weight (the identity-initialised ones would hide the attention decoder and the
    regressive connection); ``sharpen`` scales the LM heads (a confident q far from p, for the chi-square tests)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if not name.startswith("embed_tokens"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        for head in net.lm_heads:
            head.weight.mul_(sharpen)
    return net.eval()


def random_clover(target_model, num_heads: int = 4, seed: int = 0, sharpen: float = 1.0) -> CloverModel:
    cfg = CloverConfig.from_target(target_model.config, target_model.config.vocab_size, num_heads)
    net = CloverModel(cfg)
    net.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
    return randomize(net, seed, sharpen)


def val_prompts(setup) -> list[list[int]]:  # noqa: F811
    rows = datasets.load_from_disk(str(setup["data-val"]))
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):  # noqa: F811
    """Clover trained 40 steps on the target's greedy continuations (as ``test_heads``), its validation metrics
    before and after, and its native export."""
    greedy = tmp_path_factory.mktemp("greedy") / "data"
    generate(
        resolve_target(str(setup["target"])),
        str(setup["train.jsonl"]),
        greedy,
        temperature=0.0,
        max_new_tokens=24,
        device="cpu",
    )
    torch.manual_seed(0)
    model = CloverModule(str(setup["target"]), num_heads=3, distill=True, optim=OPTIM)
    data = GeneratedDataModule(str(greedy), str(setup["data-val"]), batch_size=8, max_length=64)
    root = tmp_path_factory.mktemp("clover")
    before = trainer(root, 0).validate(model, data, verbose=False)[0]
    trainer(root, 40).fit(model, data)
    after = trainer(root, 0).validate(model, data, verbose=False)[0]
    path = save_native(model.drafter, model.target, root / "export", {"topk_accuracy": model.topk_accuracy})
    return {"module": model, "before": before, "after": after, "export": path}


def test_clover_learns_and_its_tau_estimate_is_the_verifiers(trained, setup):  # noqa: F811
    before, after = trained["before"], trained["after"]
    print({k: (round(before[k], 3), round(after[k], 3)) for k in after})
    for i in range(3):  # every depth's held-out loss drops (soft labels: towards the target's entropy)
        assert after[f"val/ce_{i}"] < before[f"val/ce_{i}"] - 0.03, i
    assert after["val/loss"] < before["val/loss"] - 0.1
    assert after["val/top1_acc_1"] > before["val/top1_acc_1"] + 0.05
    assert after["val/tau_est"] > before["val/tau_est"] + 0.1

    # on the target's greedy text the estimate replays the verifier's rounds exactly (depth capped at 3 heads)
    target = Target.from_pretrained(setup["target"])
    drafter = load_trained(trained["export"], target)
    scored = score_drafters(target, {"clover": drafter}, val_prompts(setup), 4, Sampling(0.0), 24, 0)[1][0]
    assert scored.greedy_exact == len(val_prompts(setup))
    assert scored.tau_full == pytest.approx(after["val/tau_est"], rel=1e-6)
    assert trained["module"].topk_accuracy is not None and len(trained["module"].topk_accuracy) == 3


def test_saved_and_loaded_clover_drafts_as_the_trained_one(trained, setup):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    loaded = load_trained(trained["export"], target)
    assert loaded.topk_accuracy == trained["module"].topk_accuracy
    drafters = {"trained": trained["module"].drafter.as_drafter(), "loaded": loaded}
    rows = score_drafters(target, drafters, val_prompts(setup), 3, Sampling(0.0), 24, 0)[1]
    assert rows[0].tau == rows[1].tau and rows[0].greedy_exact == rows[1].greedy_exact == len(val_prompts(setup))
    ids = torch.tensor([val_prompts(setup)[0]])
    out = target(ids)
    drafts = []
    for drafter in drafters.values():  # sampled chains: the same tokens with the same q
        state = drafter.begin(ids[0], out.positions(slice(0, ids.shape[1] - 1)))
        drafts.append(drafter.propose(state, 3, Sampling(1.0), torch.Generator().manual_seed(0)))
    assert torch.equal(drafts[0].tokens, drafts[1].tokens)
    torch.testing.assert_close(drafts[0].q, drafts[1].q, rtol=0, atol=0)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_trained_clover_trees_are_exact_and_accept_more_than_a_chain(trained, setup, tree):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    chain = load_trained(trained["export"], target)
    grown = load_trained(trained["export"], target)
    grown.set_tree(TreePolicy(TreeKind(tree), size=12, top_k=3), k=3)
    rows = score_drafters(target, {"chain": chain, tree: grown}, val_prompts(setup), 3, Sampling(0.0), 24, 0)[1]
    assert all(r.greedy_exact == len(val_prompts(setup)) for r in rows)
    assert rows[1].mean_drafted > rows[0].mean_drafted  # really trees
    assert rows[1].tau > rows[0].tau


def test_training_forward_equals_drafting(setup):  # noqa: F811
    """``head_logits`` (teacher-forced, every anchor at once, a right-padded row beside) gives, at each anchor and
    depth, the logits the drafter computes from the same committed text and drafts; sibling nodes grown in one
    batch get what each gets alone."""
    torch.manual_seed(0)
    module = CloverModule(str(setup["target"]), num_heads=3)
    randomize(module.drafter)
    short = len(CONTEXT) - 3
    ids = torch.tensor([CONTEXT, CONTEXT[:short] + [0, 0, 0]])
    attention = torch.tensor([[1] * len(CONTEXT), [1] * short + [0, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": attention}
    with torch.no_grad():
        out = module.target(ids, attention_mask=attention)
        logits = module.head_logits(batch, out)  # (3, B, T, V)
    drafter = module.drafter.as_drafter()
    single = module.target(ids[:1])
    for row, length in ((0, len(CONTEXT)), (1, short)):
        for anchor in range(length - 1):
            committed = ids[0, : anchor + 2]
            state = drafter.begin(committed, single.positions(slice(0, anchor + 1)))
            scratch, first = drafter.root(state)
            torch.testing.assert_close(first, logits[0, row, anchor], atol=1e-4, rtol=1e-4)
            tokens, parents = [], []
            for depth in range(1, min(3, length - anchor - 1)):
                real, other = int(ids[0, anchor + 1 + depth]), (int(ids[0, anchor + 1 + depth]) + 1) % 90
                parent = len(tokens) - 2 if depth > 1 else -1  # the real token of the previous depth
                tokens += [real, other]
                parents += [parent, parent]
                both = drafter.grow(state, scratch, tokens, parents, [len(tokens) - 2, len(tokens) - 1])
                torch.testing.assert_close(both[0], logits[depth, row, anchor], atol=1e-4, rtol=1e-4)
                alone = drafter.grow(state, scratch, tokens, parents, [len(tokens) - 1])[0]
                torch.testing.assert_close(both[1], alone, atol=1e-4, rtol=1e-4)
                assert not torch.allclose(both[0], both[1], atol=1e-2)  # the drafted token matters


@pytest.mark.parametrize("tree", ["chain", "static", "dynamic"])
def test_greedy_with_clover_equals_plain_greedy(tokenizer, prompts, tree):
    base = make_llama(seed=0)
    target = Target(base, tokenizer)
    drafter = random_clover(base).as_drafter([[0.5, 0.3, 0.1]] * 4)
    drafter.set_tree(TreePolicy(TreeKind(tree), size=8, top_k=2), 4)
    for k in (1, 4):
        decoder = SpeculativeDecoder(target, drafter, k, Sampling())
        for prompt in prompts:
            result = decoder.generate(prompt, 25)
            assert result.tokens == plain_decode(target, prompt, 25, Sampling()).tokens
            assert max(result.depth) <= k


def sampled_pairs(target: Target, drafter, sampling: Sampling) -> torch.Tensor:
    """Counts of the first two generated tokens over 1000 runs of one depth-2 round."""
    decoder = SpeculativeDecoder(target, drafter, 2, sampling)
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7)
    for _ in range(1000):
        result = decoder.generate([1, 2, 3], 4, g)
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
    return counts


def test_sampling_with_clover_chains_is_distributed_as_the_target(soft_target):  # noqa: F811
    drafter = random_clover(soft_target.model, num_heads=2, sharpen=2.0).as_drafter()
    sampling = Sampling(temperature=1.0)
    counts = sampled_pairs(soft_target, drafter, sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) > 1e-3


def test_chi_square_catches_a_clover_draft_that_misreports_its_q(soft_target, monkeypatch):  # noqa: F811
    """Each depth's token drawn from its own q but reported with the other depth's q: biased."""
    drafter = random_clover(soft_target.model, num_heads=2, sharpen=2.0).as_drafter()
    honest = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: (lambda d: Draft(d.tokens, d.parents, d.q.flip(0)))(honest(*a)))
    sampling = Sampling(temperature=1.0)
    counts = sampled_pairs(soft_target, drafter, sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


def test_bad_settings_are_one_line_errors(setup, tmp_path, capsys):  # noqa: F811
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", f"--config={ROOT / 'configs' / 'clover.yaml'}", f"--model.init_args.target={setup['target']}",
              f"--data.train={setup['data-train']}", f"--data.val={setup['data-val']}",
              f"--trainer.default_root_dir={tmp_path}", "--model.init_args.num_heads=0"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert "model.num_heads must be at least 1, got 0" in err
    with pytest.raises(DraftsmithError, match="model.num_layers must be at least 0, got -1"):
        CloverModule(str(setup["target"]), num_layers=-1)
    with pytest.raises(DraftsmithError, match="clover: num_heads must be at least 1"):
        CloverConfig(num_heads=0)
