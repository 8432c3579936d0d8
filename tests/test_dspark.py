"""DSpark: DFlash's block drafter with a Markov head (each mask biased by the token drafted before it) and a confidence
head (the survival of the block cuts each round's draft). Drafting computes what training computes, the Markov head
moves the later masks by the earlier tokens, the cut is the head's, greedy output equals plain greedy on every
architecture, sampling stays lossless (a drafter that reports q without its Markov bias fails), training lowers the
losses and ``val/tau_est`` equals the verifier's τ with the cut."""

from __future__ import annotations

import datasets
import pytest
import torch
from conftest import make_llama
from test_architectures import ARCHITECTURES
from test_architectures import build as build_target
from test_train import datamodule, setup, trainer  # noqa: F401 - module fixture: tiny target and its data
from test_trees import soft_target  # noqa: F401 - module fixture: a soft 8-token target
from test_verifier import depth_pvalues, sampled_triples

from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling, probs
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.calibration import choose_shapes
from draftsmith.families.dflash.dspark.module import DSparkModule
from draftsmith.families.dflash.dspark.network import DSparkConfig, DSparkModel
from draftsmith.families.dflash.module import DFlashModule
from draftsmith.families.registry import load_trained
from draftsmith.families.specs import load_drafter
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.tree_draft import TreePolicy

pytestmark = pytest.mark.usefixtures("one_thread")
CONTEXT = [3, 14, 15, 9, 26, 5, 7, 41, 2]


def build(target_model, depth: int = 4, threshold: float = 0.3, markov: float = 3.0, seed: int = 0) -> DSparkModel:
    """An untrained DSpark for ``target_model`` whose heads matter: the Markov bias scaled by ``markov`` (the peers'
    init starts it near zero), a random mask embedding and a spread of confidences (so the cut varies)."""
    torch.manual_seed(seed)
    layers = (1, 1, 2) if target_model.config.num_hidden_layers >= 2 else (1, 1, 1)
    cfg = DSparkConfig.from_target(target_model.config, layers, depth, 2, markov_rank=8, threshold=threshold)
    cfg.mask_from_token = False
    model = DSparkModel(cfg)
    model.init_from_target(target_model.get_input_embeddings().weight, target_model.get_output_embeddings().weight)
    with torch.no_grad():
        torch.nn.init.normal_(model.mask_embedding)
        torch.nn.init.normal_(model.markov_head.markov_w1.weight)
        model.markov_head.markov_w2.weight.mul_(markov)
        torch.nn.init.normal_(model.confidence_head.proj.weight, std=0.15)
        model.confidence_head.proj.bias.fill_(1.5)
    return model.eval()


def survival_cut(model: DSparkModel, state, drafted: list[int], k: int) -> int:
    """How many positions the confidence head proposes, worked out from its weights: the survival (product of the
    sigmoids of proj([h_i, w1[prev_i]])) of positions 1..k, at least one position kept."""
    hidden = model.as_drafter().block_hidden(state)
    prev = torch.tensor([state.tokens[-1], *drafted])[:k]
    emb = model.markov_head.markov_w1.weight[prev]
    logit = torch.cat([hidden[: len(prev)], emb], -1) @ model.confidence_head.proj.weight[0]
    survival = torch.sigmoid(logit + model.confidence_head.proj.bias).double().cumprod(0)
    return max(1, int((survival >= model.cfg.threshold).sum()))


def test_drafting_computes_what_training_computes(tokenizer):
    """Every anchor's block from the training forward (true previous tokens) equals the drafter's root and grown rows,
    and the training confidence the head's value on the same inputs."""
    base = make_llama(seed=0)
    net = build(base)
    target = Target(base, tokenizer, net.cfg.feature_layers)
    ids = torch.tensor([CONTEXT])
    out = target(ids)
    every = torch.arange(len(CONTEXT) - 1)
    logits, confidence = (x[0] for x in net.forward_heads(ids, out.features, torch.ones_like(ids), every))
    drafter = net.as_drafter()
    for anchor in (0, 3, 5):
        committed = CONTEXT[: anchor + 2]
        state = drafter.begin(torch.tensor(committed), out.positions(slice(0, anchor + 1)))
        scratch, first = drafter.root(state)
        torch.testing.assert_close(first, logits[anchor, 0], atol=1e-5, rtol=1e-4)
        truth = CONTEXT[anchor + 2 : anchor + 5]
        for d in range(1, len(truth) + 1):  # grow the true path: depth d's row follows the true token
            row = drafter.grow(state, scratch, truth, list(range(-1, len(truth) - 1)), [d - 1])[0]
            torch.testing.assert_close(row, logits[anchor, d], atol=1e-5, rtol=1e-4)
        emb = net.markov_head.markov_w1(net.block_prev(ids, torch.tensor([anchor]))[0, 0])
        torch.testing.assert_close(net.confidence(scratch.hidden, emb), confidence[anchor], atol=1e-5, rtol=1e-4)


def test_the_markov_head_moves_a_later_mask_by_the_token_before_it(tokenizer):
    """Changing x_{a+2} (the token drafted before mask 2 of anchor a, which the block's context does not see) moves
    mask 2's logits by exactly w2(w1[new]) - w2(w1[old]) and leaves mask 1's alone; DFlash's mask 2 does not move."""
    base = make_llama(seed=0)
    net = build(base)
    target = Target(base, tokenizer, net.cfg.feature_layers)
    anchor = 2
    ids = torch.tensor([CONTEXT])
    other = ids.clone()
    other[0, anchor + 2] = (other[0, anchor + 2] + 17) % 90
    one = torch.ones_like(ids)
    before = net(ids, target(ids).features, one, torch.tensor([anchor]))[0, 0]
    after = net(other, target(other).features, one, torch.tensor([anchor]))[0, 0]
    torch.testing.assert_close(after[0], before[0])
    w2, w1 = net.markov_head.markov_w2, net.markov_head.markov_w1
    shift = w2(w1(other[0, anchor + 2])) - w2(w1(ids[0, anchor + 2]))
    assert shift.abs().max() > 1.0  # a real change of the distribution
    torch.testing.assert_close(after[1] - before[1], shift, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after[2], before[2])  # mask 3 follows x_{a+3}, unchanged
    dflash = net.__class__.__mro__[1](net.cfg)  # DFlashModel on the same config: no Markov head
    dflash.load_state_dict(net.state_dict(), strict=False)
    same = [dflash(x, target(x).features, one, torch.tensor([anchor]))[0, 0, 1] for x in (ids, other)]
    torch.testing.assert_close(same[0], same[1])


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.6, 1.0])
def test_a_round_proposes_the_positions_whose_predicted_survival_clears_the_threshold(tokenizer, threshold):
    base = make_llama(seed=0)
    net = build(base, depth=6, threshold=threshold)
    target = Target(base, tokenizer, net.cfg.feature_layers)
    drafter = net.as_drafter()
    lengths = []
    for cut in range(2, len(CONTEXT)):
        committed = CONTEXT[:cut]
        state = drafter.begin(torch.tensor(committed), target(torch.tensor([committed[:-1]])).positions(slice(None)))
        draft = drafter.propose(state, 6, Sampling(), None)
        expected = 6 if threshold == 0 else survival_cut(net, state, draft.tokens.tolist(), 6)
        assert len(draft) == expected
        lengths.append(len(draft))
    if threshold == 0.3:
        assert len(set(lengths)) > 1, lengths  # the cut varies from round to round
    if threshold == 1.0:
        assert set(lengths) == {1}


def test_confidence_threshold_is_set_from_the_command_line_and_marks_the_drafter_adaptive(setup, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    target = Target.from_pretrained(setup["target"])
    net = build(target.model)
    path = save_native(net, target, tmp_path / "native")
    assert load_trained(path, target).threshold == net.cfg.threshold
    assert load_drafter(f"confidence:0.7:{path}", target).threshold == 0.7
    assert load_drafter(f"confidence:{path}", target).threshold == net.cfg.threshold == 0.3  # recorded, not 0.4
    fixed = load_drafter(f"confidence:0:{path}", target)
    assert not fixed.adaptive and load_drafter(str(path), target).adaptive


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_greedy_with_dspark_equals_plain_greedy(name, prompts):
    base = build_target(ARCHITECTURES[name], seed=0)
    net = build(base, depth=4, threshold=0.3)
    target = Target(base, None, net.cfg.feature_layers)
    drafter = net.as_drafter([[0.5, 0.3, 0.1]] * 4)
    drafted = []
    for tree in ("chain", "dynamic") if name == "llama" else ("chain",):
        drafter.set_tree(TreePolicy(TreeKind(tree), size=8, top_k=2), 4)
        decoder = SpeculativeDecoder(target, drafter, 4, Sampling())
        for prompt in prompts:
            result = decoder.generate(prompt, 25)
            assert result.tokens == plain_decode(target, prompt, 25, Sampling()).tokens
            drafted += full_rounds(result, 4, 25)[2] if tree == "chain" else []
    assert len(set(drafted)) > 1, drafted  # the cut ran: rounds given the whole budget drafted several lengths


def honest_and_broken(model: DSparkModel):
    """The drafter, and one that draws each token from the Markov-corrected q but reports the backbone's q (the Markov
    bias forgotten in what the verifier is told)."""
    drafter, broken = model.as_drafter(), model.as_drafter()
    honest = broken.propose

    def without_markov(state, k, sampling, generator):
        draft = honest(state, k, sampling, generator)
        base = broken.model.lm_head(broken.block_hidden(state)).float()[: len(draft)]
        return Draft(draft.tokens, draft.parents, probs(base, sampling))

    broken.propose = without_markov
    return drafter, broken


def test_sampling_with_dspark_is_lossless_and_a_forgotten_markov_bias_is_caught(soft_target):  # noqa: F811
    """(x1, x2, x3) from rounds of depth up to 2 (the cut makes some depth 1) against plain sampling of the target: the
    honest drafter passes at both depths, the one reporting q without its Markov bias fails."""
    net = build(soft_target.model, depth=2, markov=2.0)
    target = Target(soft_target.model, None, net.cfg.feature_layers)
    drafter, broken = honest_and_broken(net)
    sampling = Sampling(temperature=1.0)
    prompt = [1, 2, 3]
    # a threshold between position 2's survivals after the first tokens, halving the rounds' mass: the cut depends on
    # the token drawn
    state = drafter.begin(torch.tensor(prompt), target(torch.tensor([prompt[:-1]])).positions(slice(None)))
    scratch, first_logits = drafter.root(state)
    emb = net.markov_head.markov_w1.weight
    first = torch.sigmoid(net.confidence(scratch.hidden[0], emb[prompt[-1]]))
    survival = first * torch.sigmoid(net.confidence(scratch.hidden[1].expand(len(emb), -1), emb))
    order = survival.argsort()
    below = probs(first_logits, sampling)[order].cumsum(0)
    split = int((below < 0.5).sum())
    drafter.threshold = broken.threshold = float(survival[order[split : split + 2]].mean())
    honest = depth_pvalues(target, prompt, sampling, sampled_triples(target, drafter, prompt, sampling, 1500))
    wrong = depth_pvalues(target, prompt, sampling, sampled_triples(target, broken, prompt, sampling, 1500))
    print("honest", honest, "broken", wrong)
    assert min(honest) > 1e-3
    assert min(wrong) < 1e-3
    lengths = {len(drafter.propose(state, 2, sampling, torch.Generator().manual_seed(s))) for s in range(40)}
    assert lengths == {1, 2}  # both round lengths occur in the sampled rounds


def full_rounds(result, k: int, max_new: int) -> tuple[int, int, list[int]]:
    """(tokens, rounds, tokens drafted in each) over the rounds the verifier gave the whole budget k (what
    ``val/tau_est`` replays: rounds at the end of the generation are given less)."""
    produced, tokens, rounds, drafted = 1, 0, 0, []  # the prefill gives the first token
    for accepted, n in zip(result.accepted, result.drafted, strict=True):
        if max_new - produced - 1 >= k:
            tokens, rounds = tokens + accepted + 1, rounds + 1
            drafted.append(n)
        produced += accepted + 1
    return tokens, rounds, drafted


def test_training_lowers_both_losses_and_the_estimate_is_the_verifiers_tau(setup, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    optim = OptimConfig(lr=3e-3, warmup_steps=5)
    model = DSparkModule(str(setup["target"]), depth=4, anchors=16, markov_rank=16, threshold=0.3, optim=optim)
    assert model.hparams["markov_rank"] == 16 and model.hparams["threshold"] == 0.3
    data = datamodule(setup)
    before = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    trainer(tmp_path, 40).fit(model, data)
    after = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    print({k: (round(before[k], 3), round(after[k], 3)) for k in before})
    assert after["val/loss"] < before["val/loss"] - 0.5
    assert after["val/confidence"] < before["val/confidence"]
    assert after["val/confidence_error"] < 0.6 * before["val/confidence_error"]  # the head learns the acceptance
    assert after["val/tau_est"] > before["val/tau_est"] + 0.1
    assert model.drafter.markov_head.markov_w2.weight.abs().max() > 0.05  # the Markov head was trained

    target = Target.from_pretrained(setup["target"])
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    saved = save_native(model.drafter, target, tmp_path / "native")
    drafter = load_trained(saved, target)
    tokens = rounds = 0
    drafted = []
    for prompt in prompts:
        result = SpeculativeDecoder(target, drafter, 4, Sampling()).generate(prompt, 24)
        assert result.tokens == plain_decode(target, prompt, 24, Sampling()).tokens
        t, r, n = full_rounds(result, 4, 24)
        tokens, rounds, drafted = tokens + t, rounds + r, drafted + n
    assert tokens / rounds == pytest.approx(after["val/tau_est"], rel=1e-6)
    assert min(drafted) < 4  # rounds given the whole budget were cut: the estimate replayed the cut

    # the same drafter without its cut: another estimate, again the verifier's
    model.drafter.cfg.threshold = 0.0
    uncut = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]["val/tau_est"]
    fixed = load_drafter(f"confidence:0:{saved}", target)
    tokens = rounds = 0
    for prompt in prompts:
        t, r, _ = full_rounds(SpeculativeDecoder(target, fixed, 4, Sampling()).generate(prompt, 24), 4, 24)
        tokens, rounds = tokens + t, rounds + r
    assert tokens / rounds == pytest.approx(uncut, rel=1e-6)
    assert uncut != pytest.approx(after["val/tau_est"], rel=1e-3)


def test_k_auto_profiles_a_cutting_dspark_as_it_drafts(setup, tmp_path):  # noqa: F811
    """An adaptive drafter's K is a cap: ``--k auto`` measures its acceptance by decoding (as SpecDec++'s); with the
    cut off it is a block drafter profiled from its validation accuracies."""
    target = Target.from_pretrained(setup["target"])
    net = build(target.model)
    path = save_native(net, target, tmp_path / "native", {"topk_accuracy": [[0.5, 0.2]] * 4})
    drafters = {"cut": load_drafter(str(path), target), "fixed": load_drafter(f"confidence:0:{path}", target)}
    shapes = choose_shapes({n: target for n in drafters}, drafters, [5, 9, 14, 3], Sampling(), 0)
    assert shapes["cut"].source == "calibration" and shapes["fixed"].source == "validation"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"markov_rank": 0}, "dspark: markov_rank must be at least 1"),
        ({"threshold": 1.5}, "dspark: threshold must be in [0, 1]"),
        ({"confidence_weight": -1.0}, "model.confidence_weight must be >= 0"),
        ({"depth": 0}, "dflash: depth and num_layers must be at least 1"),
    ],
)
def test_bad_settings_are_one_line_errors(setup, kwargs, message):  # noqa: F811
    with pytest.raises(DraftsmithError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DSparkModule(str(setup["target"]), **kwargs)


def test_dspark_goes_on_from_a_dflash_backbone_or_a_dspark(setup, tmp_path):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    dflash = DFlashModule(str(setup["target"]), [1, 2, 3], depth=4, mask_from_token=True).drafter
    save_native(dflash, target, tmp_path / "dflash")
    started = DSparkModule(str(setup["target"]), depth=4, markov_rank=8, init=str(tmp_path / "dflash")).drafter
    assert started.method == "dspark" and started.cfg.markov_rank == 8
    torch.testing.assert_close(started.fc.weight, dflash.fc.weight)
    save_native(started, target, tmp_path / "dspark")
    again = DSparkModule(str(setup["target"]), depth=4, markov_rank=99, init=str(tmp_path / "dspark")).drafter
    assert again.cfg.markov_rank == 8  # a DSpark start keeps its heads
    torch.testing.assert_close(again.markov_head.markov_w2.weight, started.markov_head.markov_w2.weight)


def test_going_on_from_a_deeper_dflash_or_dspark_keeps_its_depth_unless_one_is_named(setup, tmp_path):  # noqa: F811
    """An init's depth is kept by both modules (the module's default of 4 replaced a depth-8 start); a named depth
    still wins, and the checkpoint's hyperparameters record the depth trained."""
    target = Target.from_pretrained(setup["target"])
    deep = DFlashModule(str(setup["target"]), [1, 2, 3], depth=8, mask_from_token=True).drafter
    save_native(deep, target, tmp_path / "dflash8")
    init = str(tmp_path / "dflash8")
    for module in (DFlashModule(str(setup["target"]), init=init), DSparkModule(str(setup["target"]), init=init)):
        assert module.depth == module.drafter.cfg.depth == module.hparams["depth"] == 8
    named = DSparkModule(str(setup["target"]), depth=6, init=init)
    assert named.depth == named.drafter.cfg.depth == 6
    assert DFlashModule(str(setup["target"]), [1, 2, 3]).drafter.cfg.depth == 4  # a fresh network
