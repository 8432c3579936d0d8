"""EAGLE drafters: training-time test computes exactly what drafting computes; verifier stays exact; EAGLE-3.1's
norms are used, trained, saved and drafted with."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
from conftest import make_llama, make_tokenizer

from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.eagle.network import EagleDrafter, EagleModel, ttt_mask
from draftsmith.families.registry import load_network
from draftsmith.layers.losses import TOKEN_LOSSES, lk_hybrid, masked_mean, neg_log_acceptance, soft_cross_entropy
from draftsmith.layers.module import shift
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

pytestmark = pytest.mark.usefixtures("one_thread")

VERSIONS = [(1, (-1,), 0), (3, (1, 1, 2), 40)]
EAGLE31 = [{"fc_norm": True, "norm_output": True}, {"norm_before_fc": True, "norm_output": True}]
"""EAGLE-3.1's norms: the paper's per-layer fc norm, and speculators' default (one norm on the concatenation)."""


def build(target_model, version, layers, vd, seed=0, **norms):
    torch.manual_seed(seed)
    model = EagleModel(EagleConfig.from_target(target_model.config, version, layers, vd, **norms))
    if version == 3:
        model.set_draft_vocab(torch.arange(target_model.config.vocab_size).flip(0).float())
    model.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
    with torch.no_grad():  # norms away from 1, so a norm dropped from one path shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.5 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(
    ("version", "layers", "vd", "norms"), [(*v, {}) for v in VERSIONS] + [(3, (1, 1, 2), 40, n) for n in EAGLE31]
)
def test_training_time_test_unroll_equals_drafting(tokenizer, version, layers, vd, norms):
    base = make_llama(seed=0)
    model = build(base, version, layers, vd, **norms)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    drafter = EagleDrafter(model)
    context = [3, 14, 15, 9, 26, 5]  # x_0..x_5: anchors 0..4 have features
    sampling = Sampling(temperature=1.0)
    out = target(torch.tensor([context]))
    state = drafter.begin(torch.tensor(context), out.positions(slice(0, len(context) - 1)))
    draft = drafter.propose(state, 3, sampling, torch.Generator().manual_seed(0))
    seq = torch.tensor([context + draft.tokens.tolist()])
    feats = target(seq).features
    with torch.no_grad():
        steps = model.train()(seq, feats, 3, None)  # as training runs it (the drafter drafts in eval mode)
    anchor = len(context) - 2
    for j, hidden in enumerate(steps):
        q_ttt = torch.zeros(model.cfg.vocab_size)
        q_ttt[model.draft_ids] = torch.softmax(model.logits(hidden[0, anchor]), -1)
        torch.testing.assert_close(q_ttt, draft.q[j], atol=1e-5, rtol=1e-4)


def test_ttt_mask_sees_real_context_and_own_chain_only():
    mask = ttt_mask(3, 2, None, "cpu")[0, 0]
    # query anchor 1 at step 2: step-0 anchors 0,1; step-1 anchor 1; step-2 anchor 1
    assert mask[1].tolist() == [True, True, False, False, True, False, False, True, False]


def test_draft_vocab_maps_round_trip():
    base = make_llama(seed=0)
    model = build(base, 3, (1, 1, 2), 40)
    counts = torch.zeros(96)
    counts[torch.tensor([5, 90, 7, 33])] = torch.tensor([10.0, 9.0, 8.0, 7.0])
    model.set_draft_vocab(counts)
    ids = model.draft_ids
    assert ids[:].tolist() == sorted(ids.tolist()) and int(ids.max()) < 96
    assert model.t2d.sum() == 40 and bool(model.t2d[ids].all())
    assert {5, 7, 33, 90} <= set(ids.tolist())
    # t2d -> d2t: the i-th True position of t2d is draft id i
    assert torch.equal(torch.nonzero(model.t2d).flatten(), ids)


@pytest.mark.parametrize(
    ("version", "layers", "vd", "norms"), [(*v, {}) for v in VERSIONS] + [(3, (1, 1, 2), 40, n) for n in EAGLE31]
)
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_eagle_equals_plain_greedy(tokenizer, prompts, version, layers, vd, norms, k):
    base = make_llama(seed=0)
    model = build(base, version, layers, vd, **norms)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    decoder = SpeculativeDecoder(target, EagleDrafter(model), k, Sampling())
    for prompt in prompts:
        assert decoder.generate(prompt, 25).tokens == plain_decode(target, prompt, 25, Sampling()).tokens


def draft_logits(model, seq, features, steps=2):
    """Per TTT step, the (T, Vd) draft logits of ``seq`` (1, T) given the target's ``features``."""
    with torch.no_grad():
        return [model.logits(hidden[0]) for hidden in model(seq, features, steps, None)]


@pytest.mark.parametrize("norms", EAGLE31)
def test_every_eagle31_norm_weight_changes_the_draft_logits(tokenizer, norms):
    base = make_llama(seed=0)
    model = build(base, 3, (1, 1, 2), 40, **norms)
    seq = torch.randint(0, 94, (1, 12), generator=torch.Generator().manual_seed(2))
    features = Target(base, tokenizer, model.cfg.feature_layers)(seq).features
    before = draft_logits(model, seq, features)
    fused = [n for n in dict(model.named_parameters()) if n.startswith(("fc_norm.", "input_norm."))]
    assert fused == (
        ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"] if "fc_norm" in norms else ["input_norm.weight"]
    )
    for name in fused:
        weight = model.get_parameter(name)
        with torch.no_grad():
            weight.mul_(torch.linspace(0.5, 1.5, len(weight)))
        after = draft_logits(model, seq, features)
        assert (after[0] - before[0]).abs().max() > 1e-3, name
        before = after


def test_norm_output_feeds_the_normed_output_to_the_next_step_and_the_head_reads_it_once(tokenizer):
    base = make_llama(seed=0)
    plain = build(base, 3, (1, 1, 2), 40)
    post = build(base, 3, (1, 1, 2), 40, norm_output=True)
    post.load_state_dict(plain.state_dict())  # the same weights: norm_output has none of its own
    seq = torch.randint(0, 94, (1, 12), generator=torch.Generator().manual_seed(2))
    features = Target(base, tokenizer, plain.cfg.feature_layers)(seq).features
    with torch.no_grad():
        raw, normed = plain(seq, features, 2, None), post(seq, features, 2, None)
    torch.testing.assert_close(normed[0], plain.norm(raw[0]))  # step 0's output is normed before step 1 reads it
    first_plain, second_plain = draft_logits(plain, seq, features)
    first_post, second_post = draft_logits(post, seq, features)
    torch.testing.assert_close(first_post, first_plain)  # the LM head reads norm(output) once either way
    assert (second_post - second_plain).abs().max() > 1e-3  # step 1 read another feature


def test_eagle31_norms_need_eagle3_and_fc_norms_are_exclusive():
    config = make_llama(seed=0).config
    with pytest.raises(DraftsmithError, match="EAGLE-1 has no EAGLE-3.1 norms; fc_norm"):
        EagleConfig.from_target(config, 1, (-1,), fc_norm=True)
    with pytest.raises(DraftsmithError, match="exclusive"):
        EagleConfig.from_target(config, 3, (1, 1, 2), fc_norm=True, norm_before_fc=True)
    with pytest.raises(DraftsmithError, match="model.loss must be one of kl, nla, lk_hybrid, got 'tv'"):
        EagleModule("unused", loss="tv")


@pytest.mark.parametrize("loss", TOKEN_LOSSES)
def test_drafter_with_eagle31_norms_trained_by_the_module_saves_loads_and_decodes_identically(tmp_path, loss):
    """A few optimiser steps of ``EagleModule``'s own loss (each token loss), native save, registry load: the same
    network, the same flags, the same sampled speculative decoding round by round."""
    root = tmp_path / "target"
    make_llama(seed=0, layers=4).save_pretrained(root)
    make_tokenizer().save_pretrained(root)
    torch.manual_seed(0)
    module = EagleModule(str(root), 3, [1, 2, 3], draft_vocab_size=48, loss=loss, fc_norm=True, norm_output=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 94, (4, 24), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :5] = 0  # a prompt: the module computes the head and the loss at the counted positions only
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    # the loss option picks that function of layers/losses.py for every TTT step (step 0 recomputed here, over
    # every position, then masked)
    out = module.target_forward(batch)
    with torch.no_grad():
        q_logits = module.drafter.logits(module.drafter(ids, out.features, 1, batch["attention_mask"])[0])
        p = torch.softmax(out.logits_over(module.drafter.draft_ids), -1)
        fn = {"kl": soft_cross_entropy, "nla": neg_log_acceptance, "lk_hybrid": lk_hybrid}[loss]
        expected = masked_mean(fn(q_logits, shift(p, 1)), shift(batch["loss_mask"], 2).bool())
        name = "ce" if loss == "kl" else loss
        torch.testing.assert_close(module.losses(batch, out)[f"{name}_0"], expected)
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        logs = module.losses(batch, module.target_forward(batch))
        opt.zero_grad()
        logs["loss"].backward()
        opt.step()
        losses.append(float(logs["loss"]))
    assert set(logs) == {f"{name}_{j}" for j in range(3)} | {"loss"}
    assert losses[-1] < losses[0]
    network = module.drafter.eval()
    assert not torch.allclose(network.fc_norm[0].weight, torch.ones(64))  # the norms were trained

    save_native(network, module.target, tmp_path / "native")
    loaded, info = load_network(tmp_path / "native", module.target)
    assert info["config"]["fc_norm"] and info["config"]["norm_output"] and not info["config"]["norm_before_fc"]
    assert loaded.cfg == network.cfg
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v) for k, v in network.state_dict().items())
    target = Target.from_pretrained(root)
    runs = []
    for drafter in (network, loaded):
        decoder = SpeculativeDecoder(target, EagleDrafter(drafter), 4, Sampling(temperature=1.0))
        runs.append([decoder.generate([3, 14, 15, 9], 20, torch.Generator().manual_seed(s)) for s in range(3)])
    for a, b in zip(*runs, strict=True):
        assert (a.tokens, a.accepted) == (b.tokens, b.accepted)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A saved 4-layer tiny target with sampled training data and greedy validation data from it."""
    root = tmp_path_factory.mktemp("eagle31")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 32), ("val", 6)]:
        lines = [" ".join(f"w{i}" for i in torch.randint(0, 94, (2 + r % 7,), generator=g).tolist()) for r in range(n)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    common = {"max_new_tokens": 20, "device": "cpu", "shard_size": 64}
    generate(resolve_target(str(root / "target")), str(root / "train.jsonl"), root / "train", temperature=1.0, **common)
    generate(resolve_target(str(root / "target")), str(root / "val.jsonl"), root / "val", temperature=0.0, **common)
    return root


@pytest.mark.parametrize(("norms", "loss"), [(EAGLE31[0], "lk_hybrid"), (EAGLE31[1], "nla")])
def test_tau_estimate_of_an_eagle31_drafter_trained_with_an_lk_loss_replays_the_verifier(
    generated, tmp_path, norms, loss
):
    """``val/tau_est`` keeps its meaning: on greedy validation data it is the verifier's tau, round for round."""
    torch.manual_seed(0)
    model = EagleModule(str(generated / "target"), 3, draft_vocab_size=48, loss=loss, **norms)
    with torch.no_grad():  # norms away from 1, so a path that skips or repeats one drafts other tokens
        for name, p in model.drafter.named_parameters():
            if "norm" in name:
                p.add_(0.5 * torch.randn_like(p))
    data = GeneratedDataModule(str(generated / "train"), str(generated / "val"), batch_size=8, max_length=64)
    quiet = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    L.Trainer(max_steps=8, default_root_dir=tmp_path, enable_model_summary=False, **quiet).fit(model, data)
    after = L.Trainer(max_steps=0, default_root_dir=tmp_path, **quiet).validate(model, data, verbose=False)[0]
    rows = datasets.load_from_disk(str(generated / "val"))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    target = Target.from_pretrained(generated / "target")
    scored = score_drafters(target, {"eagle": model.drafter.as_drafter()}, prompts, 4, Sampling(0.0), 20, 0)[1]
    assert scored[0].greedy_exact == len(prompts)
    assert scored[0].tau_full == pytest.approx(after["val/tau_est"], rel=1e-6)


@pytest.mark.parametrize("vd", [48, 0])
def test_greedy_step_acceptance_is_the_one_hot_definitions_without_building_them(generated, vd):
    """``EagleModule.step_acceptance`` at temperature 0 compares argmaxes; its definition (one-hot target and
    drafter distributions over the full vocabulary, their overlap) gives the same tensor at every anchor, padding
    included, with a draft vocabulary (48) and without (0)."""
    from draftsmith.core.sampling import probs

    torch.manual_seed(0)
    model = EagleModule(str(generated / "target"), 3, draft_vocab_size=vd)
    data = GeneratedDataModule(str(generated / "train"), str(generated / "val"), batch_size=8, max_length=64)
    quiet = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    L.Trainer(max_steps=8, enable_model_summary=False, **quiet).fit(model, data)  # so that some drafts are accepted
    batch = next(iter(data.val_dataloader()))
    with torch.no_grad():
        out = model.target_forward(batch)
        accept, valid = model.step_acceptance(batch, out)
        p_full, ids, expected = probs(out.logits, Sampling(0.0)), model.drafter.draft_ids, []
        for j, hidden, _ in model._unroll(batch, out, model.estimate.k):
            q = torch.zeros_like(p_full)
            q[..., ids] = probs(model.drafter.logits(hidden), Sampling(0.0))
            expected.append(torch.minimum(shift(p_full, j + 1), q).sum(-1))
    assert accept.shape == (model.estimate.k, *batch["input_ids"].shape) and valid.any()
    assert torch.equal(accept, torch.stack(expected)), (accept.sum(), torch.stack(expected).sum())
    assert 0 < accept.sum() < accept.numel(), accept.sum()  # both answers occur: the comparison is not vacuous


def test_head_init_random_keeps_the_heads_own_initialisation_and_target_copies_the_targets_rows(tmp_path):
    """``model.head_init``: ``target`` starts the draft LM head at the target's rows of the draft vocabulary (again
    once the data chose that vocabulary), ``random`` at PyTorch's default (SpecForge's); the embedding is the target's
    either way; a wrong value, or ``random`` for EAGLE-1 (whose head is the target's, frozen), is one line. On a tiny
    saved target (the built-in default took 8 of CI's minutes to build for this test alone)."""
    root = tmp_path / "target"
    make_llama(seed=0, layers=4).save_pretrained(root)
    make_tokenizer().save_pretrained(root)

    class Counts:  # the training data's token counts: the last 64 ids most frequent
        def token_counts(self, vocab: int) -> torch.Tensor:
            return torch.arange(vocab, dtype=torch.float)

    for head_init in ("target", "random"):
        module = EagleModule(str(root), version=3, draft_vocab_size=64, head_init=head_init)
        net, target = module.drafter, module.target
        start = net.lm_head.weight.detach().clone()
        module.prepare_from_data(Counts())
        assert net.draft_ids.tolist() == list(range(target.config.vocab_size - 64, target.config.vocab_size))
        assert torch.equal(net.embed_tokens.weight, target.embed_tokens.weight)
        own, rows = net.lm_head.weight.detach(), target.lm_head.weight[net.draft_ids].detach()
        if head_init == "target":
            assert torch.equal(own, rows)
        else:
            assert torch.equal(own, start)  # the data's vocabulary left the random head as it was
            assert not torch.isclose(own, rows).all(dim=1).any()  # no row is the target's
            assert own.abs().max() <= own.shape[1] ** -0.5  # nn.Linear's default: uniform within 1/sqrt(fan_in)
    for kwargs, message in (
        ({"version": 3, "head_init": "zeros"}, "model.head_init must be 'target' or 'random'"),
        ({"version": 1, "head_init": "random"}, "model.head_init 'random' needs a head of its own"),
    ):
        with pytest.raises(DraftsmithError, match=message):
            EagleModule(str(root), **kwargs)
