"""EAGLE-3 with more than one decoder layer (``num_layers``, the recipe study's 2-layer row): every layer is used,
training-time test computes what drafting computes, greedy chains and trees equal plain greedy, sampling is the
target's (chi-square, failing for a draft that misreports its q), the layers save, load and export as vLLM reads
them."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama, make_tokenizer
from test_eagle import build
from test_export import read
from test_verifier import SMALL_V, depth_pvalues, sampled_triples

from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.export.registry import export
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.eagle.network import EagleDrafter, EagleModel
from draftsmith.families.registry import load_network
from draftsmith.layers.tree_draft import TreePolicy

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = (1, 1, 2)


def test_a_second_layer_is_built_used_and_cached_beside_the_first(tokenizer):
    base = make_llama(seed=0)
    one, two = build(base, 3, LAYERS, 40), build(base, 3, LAYERS, 40, num_layers=2)
    assert sorted(
        {n.split(".")[0] for n in dict(two.named_parameters())}
        - {n.split(".")[0] for n in dict(one.named_parameters())}
    ) == ["more_layers"]
    seq = torch.randint(0, 94, (1, 12), generator=torch.Generator().manual_seed(2))
    features = Target(base, tokenizer, two.cfg.feature_layers)(seq).features
    with torch.no_grad():
        out, keys, _ = two.step(seq, two.fuse(features), torch.arange(12)[None], None, None, None)
        before = two.logits(out)
        two.more_layers[0].mlp.down_proj.weight.mul_(1.5)
        after = two.logits(two.step(seq, two.fuse(features), torch.arange(12)[None], None, None, None)[0])
    assert keys.shape == (
        1,
        2 * two.cfg.shape.num_attention_heads,
        12,
        two.cfg.shape.head_dim,
    )  # both layers' heads, side by side
    assert (after - before).abs().max() > 1e-3  # the second layer's weights change the draft


@pytest.mark.parametrize("norms", [{}, {"fc_norm": True, "norm_output": True}])
@pytest.mark.parametrize("num_layers", [2, 3])
def test_training_time_test_of_a_stack_equals_its_drafting(tokenizer, num_layers, norms):
    base = make_llama(seed=0)
    model = build(base, 3, LAYERS, 40, num_layers=num_layers, **norms)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    drafter = EagleDrafter(model)
    context = [3, 14, 15, 9, 26, 5]
    out = target(torch.tensor([context]))
    state = drafter.begin(torch.tensor(context), out.positions(slice(0, len(context) - 1)))
    draft = drafter.propose(state, 3, Sampling(temperature=1.0), torch.Generator().manual_seed(0))
    seq = torch.tensor([context + draft.tokens.tolist()])
    with torch.no_grad():
        steps = model.train()(seq, target(seq).features, 3, None)
    for j, hidden in enumerate(steps):
        q_ttt = torch.zeros(model.cfg.vocab_size)
        q_ttt[model.draft_ids] = torch.softmax(model.logits(hidden[0, len(context) - 2]), -1)
        torch.testing.assert_close(q_ttt, draft.q[j], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tree", [None, TreePolicy(TreeKind.DYNAMIC, size=6, top_k=2)])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_a_two_layer_eagle3_equals_plain_greedy(tokenizer, prompts, k, tree):
    base = make_llama(seed=0)
    model = build(base, 3, LAYERS, 40, num_layers=2, fc_norm=True, norm_output=True)
    target = Target(base, tokenizer, model.cfg.feature_layers)
    drafter = EagleDrafter(model)
    if tree is not None:
        drafter.tree = tree
    decoder = SpeculativeDecoder(target, drafter, k, Sampling())
    for prompt in prompts:
        assert decoder.generate(prompt, 25).tokens == plain_decode(target, prompt, 25, Sampling()).tokens


@pytest.fixture(scope="module")
def soft_stack():
    """A soft 3-layer target over 8 tokens and a sharp 2-layer EAGLE-3 of it: drafts often rejected, q rows peaked."""
    target = Target(make_llama(seed=11, layers=3, hidden=32, vocab=SMALL_V), None, (1, 2, 3))
    target.model.lm_head.weight.data.mul_(0.15)
    torch.manual_seed(3)
    model = EagleModel(EagleConfig.from_target(target.config, 3, (1, 2, 3), num_layers=2))
    model.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return target, model.eval().as_drafter()


def test_sampling_with_a_two_layer_eagle3_is_distributed_as_the_target(soft_stack):
    target, drafter = soft_stack
    triples = sampled_triples(target, drafter, [1, 2, 3], Sampling(temperature=1.0), 1500)
    depth1, depth2 = depth_pvalues(target, [1, 2, 3], Sampling(temperature=1.0), triples)
    assert depth1 > 1e-3 and depth2 > 1e-3, (depth1, depth2)


def test_chi_square_catches_a_two_layer_draft_that_misreports_its_q(soft_stack, monkeypatch):
    """Both drafted tokens reported with the other depth's q row: biased at the depths it changes."""
    target, drafter = soft_stack
    honest = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: (lambda d: Draft(d.tokens, d.parents, d.q.flip(0)))(honest(*a)))
    triples = sampled_triples(target, drafter, [1, 2, 3], Sampling(temperature=1.0), 1500)
    depth1, depth2 = depth_pvalues(target, [1, 2, 3], Sampling(temperature=1.0), triples)
    assert min(depth1, depth2) < 1e-3, (depth1, depth2)


def test_num_layers_is_eagle3s_and_a_whole_number():
    config = make_llama(seed=0).config
    with pytest.raises(DraftsmithError, match="EAGLE-1 has one decoder layer; num_layers=2 needs version 3"):
        EagleConfig.from_target(config, 1, (-1,), num_layers=2)
    with pytest.raises(DraftsmithError, match="num_layers must be a whole number >= 1, got 0"):
        EagleConfig.from_target(config, 3, LAYERS, num_layers=0)


@pytest.fixture(scope="module")
def trained_stack(tmp_path_factory):
    """A 2-layer EAGLE-3 trained a few steps by ``EagleModule``, saved natively."""
    root = tmp_path_factory.mktemp("stack")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    torch.manual_seed(0)
    module = EagleModule(str(root / "target"), 3, [1, 2, 3], draft_vocab_size=48, num_layers=2)
    module.drafter.set_draft_vocab(torch.rand(96, generator=torch.Generator().manual_seed(1)))  # as data would
    ids = torch.randint(0, 94, (4, 24), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=3e-3)
    start = module.drafter.more_layers[0].self_attn.q_proj.weight.clone()
    for _ in range(3):
        loss = module.losses(batch, module.target_forward(batch))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    network = module.drafter.eval()
    assert not torch.equal(network.more_layers[0].self_attn.q_proj.weight, start)  # the second layer trains
    save_native(network, module.target, root / "native")
    return root, module, network


def test_a_two_layer_drafter_saves_and_loads_the_same(trained_stack):
    root, module, network = trained_stack
    loaded, info = load_network(root / "native", module.target)
    assert info["config"]["num_layers"] == 2 and loaded.cfg == network.cfg
    state = loaded.state_dict()
    assert state.keys() == network.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in network.state_dict().items())


def test_a_two_layer_drafter_exports_its_layers_as_vllm_numbers_them(trained_stack, tmp_path):
    root, module, network = trained_stack
    out = export(root / "native", "vllm", tmp_path / "vllm")
    config, tensors = read(out)
    assert config["num_hidden_layers"] == 2
    assert {k.split(".")[1] for k in tensors if k.startswith("layers.")} == {"0", "1"}
    ours = network.state_dict()
    for name, value in ours.items():
        if name.startswith("more_layers.0."):
            assert torch.equal(tensors["layers.1." + name.removeprefix("more_layers.0.")], value)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * network.cfg.shape.hidden_size
    assert tensors["layers.1.self_attn.q_proj.weight"].shape[1] == network.cfg.shape.hidden_size
    for to, engine in (("sglang", "SGLang's LlamaForCausalLMEagle3 holds one"), ("speculators", "speculators' layout")):
        with pytest.raises(DraftsmithError, match=f"--to {to}: a 2-layer EAGLE-3; .*{engine}"):
            export(root / "native", to, tmp_path / to)


def test_fine_tuning_a_stack_keeps_its_layers_and_another_depth_is_one_line(trained_stack):
    root, module, network = trained_stack
    again = EagleModule(str(root / "target"), 3, init=str(root / "native"))
    assert again.drafter.cfg.num_layers == 2
    assert all(torch.equal(again.drafter.state_dict()[k], v) for k, v in network.state_dict().items())
    with pytest.raises(DraftsmithError, match=r"model.num_layers=3: model.init .* has 2 decoder layer\(s\)"):
        EagleModule(str(root / "target"), 3, init=str(root / "native"), num_layers=3)
