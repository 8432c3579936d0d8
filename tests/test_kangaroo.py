"""Kangaroo (the target's first layers + a trained adapter, double early exit) and the SWIFT-style layer skipper."""

from __future__ import annotations

import datasets
import pytest
import torch
from conftest import VOCAB, make_llama
from test_train import datamodule, setup, trainer  # noqa: F401 - module fixture: tiny target and its data
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution

from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.families.kangaroo.module import KangarooModule
from draftsmith.families.kangaroo.network import KangarooConfig, KangarooModel
from draftsmith.families.registry import load_trained
from draftsmith.families.specs import load_drafter
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.self_draft import LayerSkipDrafter

pytestmark = pytest.mark.usefixtures("one_thread")


def val_prompts(setup) -> list[list[int]]:  # noqa: F811
    rows = datasets.load_from_disk(str(setup["data-val"]))
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


def adapter(target: Target, exit_layer: int, threshold: float, seed: int = 0) -> KangarooModel:
    """An untrained adapter whose attention is random (not the early-exit identity it starts as)."""
    torch.manual_seed(seed)
    cfg = KangarooConfig.from_target(target.config, target.vocab_size, exit_layer, threshold)
    model = KangarooModel(cfg)
    torch.nn.init.normal_(model.attn.o_proj.weight, std=0.3)
    return model.eval()


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):  # noqa: F811
    """Kangaroo (exit after layer 1 of 4, early exit below 0.3) trained 40 steps; validation before and after."""
    torch.manual_seed(0)
    model = KangarooModule(str(setup["target"]), exit_layer=1, threshold=0.3, optim=OptimConfig(3e-3, warmup_steps=5))
    root = tmp_path_factory.mktemp("kangaroo")
    data = datamodule(setup)
    before = trainer(root, 0).validate(model, data, verbose=False)[0]
    trainer(root, 40).fit(model, data)
    after = trainer(root, 0).validate(model, data, verbose=False)[0]
    export = save_native(model.drafter, model.target, root / "export")
    return {"module": model, "before": before, "after": after, "export": export}


def test_kangaroo_learns_and_its_tau_estimate_is_the_verifiers_early_exit_included(trained, setup):  # noqa: F811
    before, after = trained["before"], trained["after"]
    print({k: (round(before[k], 3), round(after[k], 3)) for k in after})
    assert after["val/ce"] < before["val/ce"] - 0.2
    assert after["val/tau_est"] > before["val/tau_est"] + 0.1
    target = Target.from_pretrained(setup["target"])
    drafter = load_trained(trained["export"], target)  # the native export round trip
    tokens, rounds, drafted = 0, 0, []
    for prompt in val_prompts(setup):
        result = SpeculativeDecoder(target, drafter, 4, Sampling()).generate(prompt, 24)
        assert result.tokens == plain_decode(target, prompt, 24, Sampling()).tokens
        committed = 1
        for accepted, n in zip(result.accepted, result.drafted, strict=True):
            if min(4, 24 - committed - 1) == 4:  # the rounds the estimate replays: not cut short by the length limit
                tokens, rounds = tokens + accepted + 1, rounds + 1
                drafted.append(n)
            committed += accepted + 1
    assert tokens / rounds == pytest.approx(after["val/tau_est"], rel=1e-6)
    assert min(drafted) < 4  # the early exit cut some drafts short


def test_drafting_on_the_shared_cache_equals_the_training_forward(trained, setup):  # noqa: F811
    """The drafter runs the shallow layers on the target's own cache; the training forward runs them (inside the
    target) over the whole sequence. Both give the same drafts, and the target's cache is left as it was."""
    module = trained["module"]
    target = Target.from_pretrained(setup["target"], feature_layers=(1,))
    drafter = module.drafter.as_drafter()
    drafter.threshold = 0.0
    drafter.bind(target)
    prompt = val_prompts(setup)[0]
    cache = target.new_cache()
    out = target(torch.tensor([prompt]), cache)
    first = int(out.logits[0, -1].argmax())
    state = drafter.begin(torch.tensor(prompt + [first]), out.positions(slice(None)))
    keys = cache.layers[0].keys.clone()
    draft = drafter.propose(state, 4, Sampling(), None).tokens.tolist()
    assert torch.equal(cache.layers[0].keys, keys)  # cropped back: the verifier finds its cache untouched
    seq = prompt + [first]
    for _ in range(4):
        ids = torch.tensor([seq])
        full = target(ids)
        logits = module.adapter_logits({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, full)
        seq.append(int(logits[0, -1].argmax()))
    assert draft == seq[len(prompt) + 1 :]


def test_skipping_no_layer_drafts_the_target_itself(setup):  # noqa: F811
    """Every layer shared from the target's cache: the drafter is the target, so every greedy draft is accepted."""
    target = Target.from_pretrained(setup["target"])
    prompt = val_prompts(setup)[1]
    result = SpeculativeDecoder(target, load_drafter("skip:0", target), 4, Sampling()).generate(prompt, 24)
    assert result.tokens == plain_decode(target, prompt, 24, Sampling()).tokens
    assert result.accepted[:-1] == result.drafted[:-1] == [4] * (len(result.accepted) - 1)


@pytest.mark.parametrize("spec", ["skip:0.5", "skip:0.25:0.4", "kangaroo"])
def test_self_drafting_greedy_equals_plain_greedy(setup, trained, spec):  # noqa: F811
    target = Target.from_pretrained(setup["target"])
    drafter = load_trained(trained["export"], target) if spec == "kangaroo" else load_drafter(spec, target)
    for prompt in val_prompts(setup)[:4]:
        result = SpeculativeDecoder(target, drafter, 4, Sampling()).generate(prompt, 24)
        assert result.tokens == plain_decode(target, prompt, 24, Sampling()).tokens
    if spec != "kangaroo":
        state = drafter.begin(
            torch.tensor(prompt), target(torch.tensor([prompt[:-1]]), target.new_cache()).positions(slice(None))
        )
        assert len(state.own) < 4 - state.shared  # some layer was skipped


@pytest.fixture(scope="module")
def soft_target() -> Target:
    """Three layers over 8 tokens, soft enough that drafts are often rejected."""
    target = Target(make_llama(seed=11, layers=3, hidden=32, vocab=SMALL_V))
    target.model.lm_head.weight.data.mul_(0.15)
    return target


def soft_drafter(target: Target, kind: str):
    if kind == "skip":
        return LayerSkipDrafter(0.5, threshold=0.2)
    drafter = adapter(target, 1, threshold=0.2).as_drafter()
    return drafter


def pairs(target: Target, drafter, sampling: Sampling) -> torch.Tensor:
    decoder = SpeculativeDecoder(target, drafter, 2, sampling)
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7)
    for _ in range(1500):
        result = decoder.generate([1, 2, 3], 4, g)  # one round of up to two drafts
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
    return counts


@pytest.mark.parametrize("kind", ["kangaroo", "skip"])
def test_self_drafted_sampling_is_distributed_as_the_target(soft_target, kind):
    sampling = Sampling(temperature=0.5)  # sharp enough that a misreported q shows
    counts = pairs(soft_target, soft_drafter(soft_target, kind), sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) > 1e-3


def test_chi_square_catches_a_self_draft_that_misreports_its_q(soft_target, monkeypatch):
    """Tokens drawn from q but reported with q shifted by one token: biased."""
    drafter = soft_drafter(soft_target, "kangaroo")
    honest = drafter.propose
    monkeypatch.setattr(
        drafter, "propose", lambda *a: (lambda d: Draft(d.tokens, d.parents, d.q.roll(1, -1)))(honest(*a))
    )
    sampling = Sampling(temperature=0.5)  # sharp enough that a misreported q shows
    counts = pairs(soft_target, drafter, sampling)
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exit_layer": 0}, "model.exit_layer must be at least 1"),
        ({"exit_layer": 4}, "model.exit_layer must be below the target's 4 layers"),
        ({"threshold": 1.5}, "model.threshold must be in [0, 1]"),
    ],
)
def test_bad_settings_are_one_line_errors(setup, kwargs, message):  # noqa: F811
    with pytest.raises(DraftsmithError, match=message.replace("[", r"\[").replace("]", r"\]")):
        KangarooModule(str(setup["target"]), **kwargs)


@pytest.mark.parametrize("spec", ["skip:1", "skip:0.5:2", "skip:half"])
def test_bad_skip_specs_are_one_line_errors(spec, target):
    with pytest.raises(DraftsmithError, match="expected skip, skip:RATIO or skip:RATIO:THRESHOLD"):
        load_drafter(spec, target)


def test_layer_skipping_refuses_a_target_without_a_middle_layer_in_one_line(target):
    with pytest.raises(DraftsmithError, match="drafter skip: the target's 2 layers have no middle layer to skip"):
        SpeculativeDecoder(target, load_drafter("skip:0.5", target), 4, Sampling())


def test_self_drafting_refuses_a_target_that_is_not_llama_shaped(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=2, n_positions=64)
    gpt2 = Target(GPT2LMHeadModel(config).eval(), tokenizer)
    with pytest.raises(
        DraftsmithError, match="needs a Llama-style decoder .* GPT2LMHeadModel does not have that shape"
    ):
        SpeculativeDecoder(gpt2, LayerSkipDrafter(0.5), 4, Sampling())
