"""Parallel drafters (PARD, P-EAGLE, DFlash): one forward drafts every depth, the training forward computes
exactly what drafting computes, and the verifier stays exact (greedy) and lossless (sampling)."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from conftest import VOCAB, make_llama
from test_train import datamodule, setup, trainer  # noqa: F401 - module fixture: tiny target and its data
from test_trees import soft_target  # noqa: F401 - module fixture: a soft 8-token target
from test_verifier import SMALL_V, chi_square_pvalue, exact_pair_distribution

from draftsmith.core.draft import Draft
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.core.trees import TreeKind
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.dflash.module import DFlashModule
from draftsmith.families.dflash.network import DFlashConfig, DFlashModel
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.peagle.module import PEagleModule
from draftsmith.families.eagle.peagle.network import PEagleConfig, PEagleModel
from draftsmith.families.pard.module import PardModule
from draftsmith.families.pard.network import PardConfig, PardNetwork
from draftsmith.families.registry import extended, load_trained
from draftsmith.layers.module import OptimConfig
from draftsmith.layers.parallel import keep_anchors, parallel_layout, split_depths
from draftsmith.layers.tree_draft import TreePolicy

FAMILIES = ["pard", "peagle", "dflash"]
CONTEXT = [3, 14, 15, 9, 26, 5, 7]


def build(family: str, target_model, depth: int = 4, seed: int = 0, sharpen: float = 1.0):
    """An untrained network of ``family`` for ``target_model`` with random (not zero) placeholders; ``sharpen``
    scales its LM head (a confident drafter: q far from the target's p, what the chi-square tests need)."""
    torch.manual_seed(seed)
    vocab = target_model.config.vocab_size
    if family == "pard":
        student = make_llama(seed=seed + 3, layers=1, vocab=vocab)
        student.lm_head.weight.data.mul_(sharpen)
        return PardNetwork(PardConfig(student.config.to_dict(), vocab - 1, depth), student).eval()
    layers = (1, 1, 2) if target_model.config.num_hidden_layers >= 2 else (1, 1, 1)
    if family == "dflash":
        model = DFlashModel(DFlashConfig.from_target(target_model.config, layers, depth, num_layers=2))
        model.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
        torch.nn.init.normal_(model.mask_embedding)
        model.lm_head.weight.data.mul_(sharpen)
        return model.eval()
    eagle3 = EagleConfig.from_target(target_model.config, 3, layers, max(4, vocab // 2))
    cfg = extended(eagle3, PEagleConfig, depth=depth)
    cfg.mask_token_id = vocab - 1
    model = PEagleModel(cfg)
    model.set_draft_vocab(torch.arange(vocab).flip(0).float())
    model.init_from_target(target_model.model.embed_tokens.weight, target_model.lm_head.weight)
    torch.nn.init.normal_(model.mask_hidden)
    model.lm_head.weight.data.mul_(sharpen)
    return model.eval()


def training_logits(family: str, net, target: Target, ids: torch.Tensor, anchors):
    """Per depth, {anchor: logits over the target vocabulary} of the parallel training forward."""
    if family == "dflash":
        every = torch.arange(ids.shape[1] - 1)
        logits = net(ids, target(ids).features, torch.ones_like(ids), every)[0]  # (n, depth, V)
        return [dict(zip(every.tolist(), logits[:, d], strict=True)) for d in range(net.cfg.depth)]
    if family == "pard":
        layout = parallel_layout(torch.ones_like(ids), anchors, 1)
        masks = torch.full((1, layout.mask.shape[-1] - ids.shape[1]), net.cfg.mask_token_id)
        logits = net(torch.cat([ids, masks], 1), layout)
        first = logits[:, 1 : ids.shape[1]]
    else:
        layout = parallel_layout(torch.ones_like(ids), anchors, 0)
        draft = net.logits(net.parallel(ids, target(ids).features, layout))
        logits = torch.full((*draft.shape[:-1], target.vocab_size), float("-inf"))
        logits[..., net.draft_ids] = draft
        first = logits[:, : ids.shape[1]]
    depths = [dict(enumerate(first[0]))]
    for a, part in zip(anchors, split_depths(logits, layout), strict=True):
        depths.append(dict(zip(a.tolist(), part[0], strict=True)))
    return depths


def test_keep_anchors_shrink_and_nest():
    kept = keep_anchors(40, 4, 0.5, torch.Generator().manual_seed(0))
    assert [len(k) for k in kept] == [20, 10, 5]
    assert all(set(deeper.tolist()) <= set(k.tolist()) for k, deeper in zip(kept, kept[1:], strict=False))
    assert [len(k) for k in keep_anchors(40, 3, 1.0, None)] == [40, 40]


def test_a_placeholder_sees_its_anchors_context_and_its_own_chain_only():
    anchors = [torch.tensor([0, 2]), torch.tensor([2])]
    layout = parallel_layout(torch.ones(1, 4), anchors, 1)
    mask = layout.mask[0, 0]
    # rows: real 0..3, depth-1 placeholders of anchors 0 and 2, depth-2 placeholder of anchor 2
    assert mask[6].tolist() == [True, True, True, True, False, True, True]
    assert mask[4].tolist() == [True, True, False, False, True, False, False]
    assert layout.positions[0].tolist() == [0, 1, 2, 3, 2, 4, 5]


@pytest.mark.parametrize("family", FAMILIES)
def test_training_forward_equals_drafting(tokenizer, family):
    base = make_llama(seed=0)
    net = build(family, base)
    target = Target(base, tokenizer, getattr(net.cfg, "feature_layers", (-1,)))
    drafter = net.as_drafter()
    ids = torch.tensor([CONTEXT])
    if family == "dflash":  # the block's masks see each other: drafting the whole block is what it trains
        drafter.max_depth = 4
    n = len(CONTEXT) - (1 if family == "pard" else 0)
    anchors = keep_anchors(n, 4, 1.0, None)
    depths = training_logits(family, net, target, ids, anchors)
    out = target(ids)
    for anchor in (0, 3, 5):
        committed = torch.tensor(CONTEXT[: anchor + 2])
        state = drafter.begin(committed, out.positions(slice(0, anchor + 1)))
        block = drafter.block_logits(state, 4)
        for d in range(4):
            torch.testing.assert_close(block[d], depths[d][anchor], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree", ["chain", "static", "dynamic"])
def test_greedy_with_a_parallel_drafter_equals_plain_greedy(tokenizer, prompts, family, tree):
    base = make_llama(seed=0)
    net = build(family, base)
    target = Target(base, tokenizer, getattr(net.cfg, "feature_layers", (-1,)))
    accuracy = [[0.5, 0.3, 0.1]] * 4
    drafter = net.as_drafter(accuracy)
    drafter.set_tree(TreePolicy(TreeKind(tree), size=8, top_k=2), 4)
    for k in (1, 4):
        decoder = SpeculativeDecoder(target, drafter, k, Sampling())
        for prompt in prompts:
            result = decoder.generate(prompt, 25)
            assert result.tokens == plain_decode(target, prompt, 25, Sampling()).tokens
            assert max(result.depth) <= k


def test_a_parallel_drafter_drafts_every_depth_in_one_forward(tokenizer, prompts):
    base = make_llama(seed=0)
    net = build("pard", base)
    calls = []
    net.model.register_forward_hook(lambda *_: calls.append(1))
    decoder = SpeculativeDecoder(Target(base, tokenizer), net.as_drafter(), 4, Sampling())
    result = decoder.generate(prompts[0], 25)
    assert len(calls) == len(result.drafted) - result.drafted.count(0) and max(result.drafted) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_with_a_parallel_drafter_is_distributed_as_the_target(soft_target, family):  # noqa: F811
    net = build(family, soft_target.model, depth=2, sharpen=4.0)
    if family != "pard":
        soft_target = Target(soft_target.model, None, net.cfg.feature_layers)
    sampling = Sampling(temperature=1.0)
    decoder = SpeculativeDecoder(soft_target, net.as_drafter(), 2, sampling)
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7)
    for _ in range(1500):
        result = decoder.generate([1, 2, 3], 4, g)  # one depth-2 round
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) > 1e-3


def test_chi_square_catches_a_parallel_draft_that_misreports_its_q(soft_target, monkeypatch):  # noqa: F811
    """Each depth's token drawn from its own q but reported with the other depth's q: biased."""
    drafter = build("pard", soft_target.model, depth=2, sharpen=4.0).as_drafter()
    honest = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: (lambda d: Draft(d.tokens, d.parents, d.q.flip(0)))(honest(*a)))
    sampling = Sampling(temperature=1.0)
    decoder = SpeculativeDecoder(soft_target, drafter, 2, sampling)
    counts, g = torch.zeros(SMALL_V * SMALL_V), torch.Generator().manual_seed(7)
    for _ in range(1500):
        result = decoder.generate([1, 2, 3], 4, g)
        counts[result.tokens[0] * SMALL_V + result.tokens[1]] += 1
    assert chi_square_pvalue(counts, exact_pair_distribution(soft_target, [1, 2, 3], sampling)) < 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_training_raises_tau_estimate_and_scores_as_estimated(setup, tmp_path, family):  # noqa: F811
    torch.manual_seed(0)
    optim = OptimConfig(lr=3e-3, warmup_steps=5)
    if family == "pard":
        model = PardModule(str(setup["target"]), depth=4, keep_ratio=0.5, optim=optim)
    elif family == "dflash":
        model = DFlashModule(str(setup["target"]), depth=4, anchors=16, optim=optim)
    else:
        model = PEagleModule(str(setup["target"]), draft_vocab_size=48, depth=4, keep_ratio=0.5, optim=optim)
    data = datamodule(setup)
    before = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    trainer(tmp_path, 60).fit(model, data)
    after = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    print(family, {k: (round(before[k], 3), round(after[k], 3)) for k in before})
    # soft cross-entropy against a sampled (T = 1) target: its entropy, about 4.2 nats per depth, is the floor
    assert after["val/loss"] < before["val/loss"] - 0.2 * model.depth
    assert after["val/tau_est"] > before["val/tau_est"] + 0.2
    assert model.drafter.cfg.mask_token_id == rarest(data)

    # on greedy validation data the estimate replays the verifier's rounds exactly, and save/load keeps drafts
    target = Target.from_pretrained(setup["target"])
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    saved = save_native(model.drafter, target, tmp_path / "native")
    drafters = {"trained": model.drafter.as_drafter(), "loaded": load_trained(saved, target)}
    scored = score_drafters(target, drafters, prompts, 4, Sampling(0.0), 24, 0)[1]
    assert [row.greedy_exact for row in scored] == [len(prompts)] * 2
    assert scored[0].tau_full == pytest.approx(after["val/tau_est"], rel=1e-6)
    assert scored[1].tau == scored[0].tau


def rarest(data) -> int:
    counts = data.token_counts(VOCAB)
    return int((counts == counts.min()).nonzero()[-1])


@pytest.mark.parametrize(
    ("family", "kwargs", "message"),
    [
        ("pard", {"depth": 0}, "model.depth must be at least 1"),
        ("pard", {"keep_ratio": 0.0}, "model.keep_ratio must be in (0, 1]"),
        ("pard", {"mask_token_id": 96}, "model.mask_token_id must be a token id below 96"),
        ("peagle", {"depth": 0}, "model.depth must be at least 1"),
        ("dflash", {"depth": 0}, "dflash: depth and num_layers must be at least 1"),
        ("dflash", {"anchors": 0}, "model.anchors must be at least 1"),
    ],
)
def test_bad_settings_are_one_line_errors(setup, family, kwargs, message):  # noqa: F811
    cls = {"pard": PardModule, "peagle": PEagleModule, "dflash": DFlashModule}[family]
    with pytest.raises(DraftsmithError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        cls(str(setup["target"]), **kwargs)


def exported(setup, tmp_path, module, to: str = "vllm") -> tuple[dict, dict, str]:  # noqa: F811
    from safetensors.torch import load_file

    from draftsmith.export.registry import write_export

    save_native(module.drafter, module.target, tmp_path / "native")
    out = tmp_path / to
    command = write_export(tmp_path / "native", to, out)
    tensors = load_file(out / "model.safetensors")
    return json.loads((out / "config.json").read_text()), tensors, command


def test_pard_exports_a_causal_lm_with_its_mask_token_for_vllm_parallel_drafting(setup, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    module = PardModule(str(setup["target"]), depth=3, mask_token_id=90)
    config, _, command = exported(setup, tmp_path, module)
    assert config["pard_token"] == 90 and config["vocab_size"] == VOCAB
    assert '"method": "draft_model"' in command and '"parallel_drafting": true' in command
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "vllm")
    ids = torch.tensor([CONTEXT])
    torch.testing.assert_close(reloaded(ids).logits, module.drafter.model.eval()(ids).logits)


def test_peagle_exports_eagle3_with_mask_hidden_and_mask_token(setup, tmp_path):  # noqa: F811
    module = PEagleModule(str(setup["target"]), [1, 2, 3], draft_vocab_size=48, depth=3, mask_token_id=90)
    module.drafter.set_draft_vocab(torch.arange(VOCAB).float())  # what fit's data does
    config, tensors, command = exported(setup, tmp_path, module)
    assert config["pard_token"] == 90 and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert tensors["mask_hidden"].shape == (1, 1, 3 * module.target.hidden_size)  # vLLM views it (1, -1)
    # SpecForge's PEagleDraftModel reads the same dir (tests/test_peers.py): its token, depth and capture layers
    assert (config["mask_token_id"], config["num_depths"]) == (90, 3)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert tensors["fc.weight"].shape == (module.drafter.cfg.shape.hidden_size, 3 * module.target.hidden_size)
    assert '"method": "eagle3"' in command and '"parallel_drafting": true' in command


def test_dflash_exports_vllms_dflash_draft_model(setup, tmp_path):  # noqa: F811
    module = DFlashModule(str(setup["target"]), [1, 2, 3], depth=3, mask_token_id=90)
    config, tensors, command = exported(setup, tmp_path, module)
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 90, "target_layer_ids": [0, 1, 2]}
    layer = {k.removeprefix("layers.0.") for k in tensors if k.startswith("layers.0.")}
    assert {"self_attn.q_norm.weight", "self_attn.k_norm.weight", "input_layernorm.weight"} <= layer
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= set(tensors)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in tensors)  # shared with the target
    mask = torch.load(tmp_path / "vllm" / "mask_embedding.pt")
    torch.testing.assert_close(mask, module.drafter.mask_embedding.detach())
    assert '"method": "dflash"' in command and '"num_speculative_tokens": 3' in command


def test_a_dflash_with_token_masks_embeds_them_as_the_token_and_exports_for_speculators(setup, tmp_path):  # noqa: F811
    """``mask_from_token``: the masks are the target's embedding of mask_token_id, frozen (what speculators' DFlash
    computes); the speculators export carries the block, the feature layers and the token. A learned mask is refused
    there, naming the option (tests/test_peers.py runs speculators' own class on the export)."""
    module = DFlashModule(str(setup["target"]), [1, 2, 3], depth=3, mask_token_id=90, mask_from_token=True)
    network = module.drafter
    assert not network.mask_embedding.requires_grad
    assert all(p.requires_grad for n, p in network.named_parameters() if n.startswith(("fc.", "layers.")))
    torch.testing.assert_close(network.mask(), module.target.embed_tokens.weight[90])
    config, tensors, _ = exported(setup, tmp_path, module, "speculators")
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    assert config["aux_hidden_state_layer_ids"] == [1, 2, 3] and config["mask_token_id"] == 90
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert config["transformer_layer_config"]["model_type"] == "qwen3" and "mask_embedding" not in tensors
    exported(setup, tmp_path / "v", module)
    assert not (tmp_path / "v" / "vllm" / "mask_embedding.pt").exists()  # vLLM embeds the mask id, as the drafter
    config, _, command = exported(setup, tmp_path / "s", module, "sglang")  # z-lab's layout, as vLLM's
    assert config["dflash_config"] == {"mask_token_id": 90, "target_layer_ids": [0, 1, 2]} and config["block_size"] == 4
    assert "--speculative-algorithm DFLASH" in command and "--speculative-dflash-block-size 4" in command
    learned = DFlashModule(str(setup["target"]), [1, 2, 3], depth=3, mask_token_id=90)
    for fmt in ("speculators", "sglang"):
        with pytest.raises(DraftsmithError, match="learned its own mask embedding.*mask_from_token: true"):
            exported(setup, tmp_path / f"l-{fmt}", learned, fmt)


def test_a_two_layer_dflash_is_refused_for_vllm_naming_why(setup, tmp_path):  # noqa: F811
    module = DFlashModule(str(setup["target"]), [1, 2, 3], depth=3, num_layers=2)
    with pytest.raises(DraftsmithError, match="first layer's k_norm.*num_layers: 1"):
        exported(setup, tmp_path, module)


def test_peagle_starts_from_an_eagle3_drafting_its_first_token_or_from_a_peagle(setup, tmp_path):  # noqa: F811
    from draftsmith.families.eagle.module import EagleModule

    eagle3 = EagleModule(str(setup["target"]), 3, [1, 2, 3], draft_vocab_size=48)
    eagle3.drafter.set_draft_vocab(torch.arange(VOCAB).float())
    save_native(eagle3.drafter, eagle3.target, tmp_path / "eagle3")
    module = PEagleModule(str(setup["target"]), init=str(tmp_path / "eagle3"), depth=3, mask_token_id=90)
    assert module.drafter.cfg.feature_layers == (1, 2, 3) and module.drafter.cfg.draft_vocab_size == 48
    target = Target.from_pretrained(setup["target"], feature_layers=(1, 2, 3))
    ids = torch.tensor([CONTEXT])
    out = target(ids)
    ours, theirs = module.drafter.as_drafter(), eagle3.drafter.as_drafter()
    first = [d.propose(d.begin(ids[0], out.positions(slice(0, len(CONTEXT) - 1))), 3, Sampling(1.0), None).q[0]
             for d in (ours, theirs)]  # fmt: skip
    torch.testing.assert_close(first[0], first[1])
    with torch.no_grad():
        module.drafter.mask_hidden.add_(1.0)
    save_native(module.drafter, module.target, tmp_path / "peagle")  # a P-EAGLE goes on as it is (fine-tuning)
    again = PEagleModule(str(setup["target"]), init=str(tmp_path / "peagle"), depth=3)
    assert again.drafter.cfg.mask_token_id == 90
    assert all(torch.equal(v, module.drafter.state_dict()[k]) for k, v in again.drafter.state_dict().items())
    eagle1 = EagleModule(str(setup["target"]), 1)
    save_native(eagle1.drafter, eagle1.target, tmp_path / "eagle1")
    with pytest.raises(DraftsmithError, match="holds a eagle1 drafter, not eagle3 or peagle"):
        PEagleModule(str(setup["target"]), init=str(tmp_path / "eagle1"))
