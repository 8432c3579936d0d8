"""EAGLE drafters: training-time test computes exactly what drafting computes; verifier stays exact."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.eval.verifier import SpeculativeDecoder, plain_decode
from draftsmith.families.eagle.network import EagleConfig, EagleDrafter, EagleModel, ttt_mask

VERSIONS = [(1, (-1,), 0), (3, (1, 1, 2), 40)]


def build(target_model, version, layers, vd, seed=0):
    torch.manual_seed(seed)
    model = EagleModel(EagleConfig.from_target(target_model.config, version, layers, vd))
    if version == 3:
        model.set_draft_vocab(torch.arange(target_model.config.vocab_size).flip(0).float())
    model.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
    return model


@pytest.mark.parametrize(("version", "layers", "vd"), VERSIONS)
def test_training_time_test_unroll_equals_drafting(tokenizer, version, layers, vd):
    base = make_llama(seed=0)
    model = build(base, version, layers, vd)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    drafter = EagleDrafter(model)
    context = [3, 14, 15, 9, 26, 5]  # x_0..x_5: anchors 0..4 have features
    sampling = Sampling(temperature=1.0)
    out = target(torch.tensor([context]))
    state = drafter.begin(torch.tensor(context), out.positions(slice(0, len(context) - 1)))
    draft = drafter.propose(state, 3, sampling, torch.Generator().manual_seed(0))
    seq = torch.tensor([context + draft.tokens.tolist()])
    feats = target(seq).features
    steps = model(seq, feats, 3, None)
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


@pytest.mark.parametrize(("version", "layers", "vd"), VERSIONS)
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_eagle_equals_plain_greedy(tokenizer, prompts, version, layers, vd, k):
    base = make_llama(seed=0)
    model = build(base, version, layers, vd)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    decoder = SpeculativeDecoder(target, EagleDrafter(model), k, Sampling())
    for prompt in prompts:
        assert decoder.generate(prompt, 25).tokens == plain_decode(target, prompt, 25, Sampling()).tokens
