"""``draftsmith export``: every (format, family) written exactly as its loader reads it.

The spec table below is the contract, each row citing the loader source it was read from. Files are
re-read the way the loaders read them (safetensors names, shapes, dtypes; config keys). A real vLLM
serves these exports in ``tests/test_export_vllm.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from draftsmith.cli import main
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder
from draftsmith.errors import DraftsmithError
from draftsmith.export import eagle_layout, speculators, vllm
from draftsmith.export.common import load_source
from draftsmith.export.registry import export, methods
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.network import EagleModel
from draftsmith.families.hydra.network import HydraConfig, HydraModel
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel
from draftsmith.families.registry import export_formats, load_network, load_trained
from draftsmith.layers.features import default_feature_layers
from draftsmith.layers.shape import LayerShape

LAYERS, H, HEADS, VD, MEDUSA_HEADS = 4, 64, 4, 40, 3
HD = H // HEADS
LAYER = {  # the decoder layer's tensors, shared by EAGLE-1 (q/k/v take H) and EAGLE-3 (2H)
    "self_attn.o_proj.weight": (H, H),
    "post_attention_layernorm.weight": (H,),
    "mlp.gate_proj.weight": (2 * H, H),
    "mlp.up_proj.weight": (2 * H, H),
    "mlp.down_proj.weight": (H, 2 * H),
}


def eagle3_layer(prefix: str) -> dict:
    qkv = {f"self_attn.{p}_proj.weight": (H, 2 * H) for p in "qkv"}
    norms = {"input_layernorm.weight": (H,), "hidden_norm.weight": (H,)}
    return {prefix + k: v for k, v in {**LAYER, **qkv, **norms}.items()}


def eagle1_layer(prefix: str) -> dict:
    return {prefix + k: v for k, v in {**LAYER, **{f"self_attn.{p}_proj.weight": (H, H) for p in "qkv"}}.items()}


EAGLE3_REST = {
    "embed_tokens.weight": (VOCAB, H),
    "fc.weight": (H, 3 * H),
    "norm.weight": (H,),
    "lm_head.weight": (VD, H),
    "d2t": ((VD,), torch.int64),
    "t2d": ((VOCAB,), torch.bool),
}
EAGLE3_CONFIG = {
    "draft_vocab_size": VD,
    "target_hidden_size": H,
    "num_hidden_layers": 1,
    "hidden_size": H,
    "head_dim": HD,
    "vocab_size": VOCAB,
    "norm_before_residual": False,
    "norm_before_fc": False,
    "tie_word_embeddings": False,
}

SPEC = {
    # vLLM 0.32 model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM.load_weights: d2t ->
    # draft_id_to_target_id, t2d skipped, layers.0 / midlayer; fc [H, 3*Ht] no bias; lm_head [Vd, H]);
    # gpu_model_runner.py::_get_eagle3_aux_layers_from_config (top-level ids, id k = HF hidden_states[k]).
    ("vllm", "eagle3"): {
        "tensors": {**eagle3_layer("layers.0."), **EAGLE3_REST},
        "config": {
            "architectures": ["Eagle3LlamaForCausalLM"],
            **EAGLE3_CONFIG,
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        },
    },
    # vLLM 0.32 llama_eagle.py: fc ReplicatedLinear(2H, H, bias=False) (its bias is folded into
    # embed_tokens), layer 0 without input_layernorm, no lm_head (the target's).
    ("vllm", "eagle1"): {
        "tensors": {**eagle1_layer("layers.0."), "fc.weight": (H, 2 * H), "embed_tokens.weight": (VOCAB, H)},
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": H,
        },
    },
    # vLLM 0.32 medusa.py + transformers_utils/configs/medusa.py: blocks.i.layers.j (bias only with
    # medusa_fc_bias), lm_heads.i [V, H]; num_heads, num_hidden_layers, truncated_vocab_size.
    ("vllm", "medusa1"): {
        "tensors": {
            **{
                f"blocks.{i}.layers.0.{p}": (H, H) if p == "weight" else (H,)
                for i in range(3)
                for p in ("weight", "bias")
            },
            **{f"lm_heads.{i}.weight": (VOCAB, H) for i in range(MEDUSA_HEADS)},
        },
        "config": {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "hidden_size": H,
            "vocab_size": VOCAB,
            "num_heads": MEDUSA_HEADS,
            "num_hidden_layers": 1,
            "truncated_vocab_size": VOCAB,
            "medusa_fc_bias": True,
        },
    },
    # SGLang srt/models/llama_eagle3.py (LlamaForCausalLMEagle3: model.midlayer, fc [H, 3*Ht], d2t ->
    # hot_token_id) + model_runner.py (eagle_config ids, captured at id + 1 by models/llama.py).
    ("sglang", "eagle3"): {
        "tensors": {**eagle3_layer("midlayer."), **EAGLE3_REST},
        "config": {
            "architectures": ["LlamaForCausalLMEagle3"],
            **EAGLE3_CONFIG,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        },
        # SGLang/vLLM default it to False, SpecForge's class to True with another meaning: both are draftsmith's
        "absent": ["norm_output"],
    },
    # SGLang srt/models/llama_eagle.py (LlamaForCausalLMEagle: fc nn.Linear(2H, H) with bias, layer 0
    # without input_layernorm, embed/lm_head from the target).
    ("sglang", "eagle1"): {
        "tensors": {**eagle1_layer("layers.0."), "fc.weight": (H, 2 * H), "fc.bias": (H,)},
        "config": {"architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1, "tie_word_embeddings": False},
    },
    # speculators 0.3.0 models/eagle3/{config,core}.py + vLLM 0.32 transformers_utils/configs/speculators.
    ("speculators", "eagle3"): {
        "tensors": {**eagle3_layer("layers.0."), **EAGLE3_REST},
        "config": {
            "architectures": ["Eagle3DraftModel"],
            "speculators_model_type": "eagle3",
            "draft_vocab_size": VD,
            "target_hidden_size": H,
            "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        },
    },
}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """A saved 4-layer target and native EAGLE-3 / EAGLE-1 / Medusa / Hydra drafters for it (random
    weights: the layout does not need training), plus the targets the drafters read."""
    root = tmp_path_factory.mktemp("export")
    make_llama(seed=0, layers=LAYERS).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    t3 = Target.from_pretrained(root / "target", feature_layers=(1, 2, 3))
    t1 = Target.from_pretrained(root / "target", feature_layers=(-1,))
    torch.manual_seed(0)
    e3 = EagleModel(EagleConfig.from_target(t3.config, 3, t3.feature_layers, draft_vocab_size=VD))
    e3.set_draft_vocab(torch.rand(VOCAB))
    e1 = EagleModel(EagleConfig.from_target(t1.config, 1, t1.feature_layers))
    for net in (e3, e1):
        with torch.no_grad():
            for p in net.parameters():
                p.normal_(0, 0.2)
        net.init_from_target(t3.embed_tokens.weight, t3.lm_head.weight)
    medusa = MedusaModel(MedusaConfig(num_heads=MEDUSA_HEADS, num_layers=1, hidden_size=H, vocab_size=VOCAB))
    with torch.no_grad():
        for p in medusa.parameters():
            p.normal_(0, 0.1)
    hydra = HydraModel(HydraConfig(num_heads=2, shape=LayerShape(hidden_size=H), vocab_size=VOCAB))
    dirs = {"target": root / "target", "t3": t3, "t1": t1, "root": root}
    for name, net, t in [("eagle3", e3, t3), ("eagle1", e1, t1), ("medusa1", medusa, t1), ("hydra", hydra, t1)]:
        dirs[name] = save_native(net, t, root / name)
    return dirs


def read(out: Path) -> tuple[dict, dict]:
    return json.loads((out / "config.json").read_text()), load_file(out / "model.safetensors")


@pytest.mark.parametrize(("fmt", "method"), list(SPEC))
def test_export_matches_the_loader_spec(env, tmp_path, fmt, method):
    out = export(env[method], fmt, tmp_path / "out")
    config, tensors = read(out)
    spec = SPEC[(fmt, method)]
    assert set(tensors) == set(spec["tensors"])
    for name, want in spec["tensors"].items():
        shape, dtype = want if isinstance(want[-1], torch.dtype) else (want, torch.float32)
        assert tuple(tensors[name].shape) == shape, name
        assert tensors[name].dtype == dtype, name
    for key, value in spec["config"].items():
        assert config[key] == value, key
    for key in spec.get("absent", []):
        assert key not in config, key


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_eagle3_vocab_maps_are_exact(env, tmp_path, fmt):
    """d2t always present (Vd < V), an ascending offset map into the target vocabulary that t2d marks."""
    _, tensors = read(export(env["eagle3"], fmt, tmp_path / "out"))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    ids = torch.arange(VD) + d2t
    assert len(d2t) == VD < VOCAB
    assert bool((ids[1:] > ids[:-1]).all()) and int(ids.max()) < VOCAB
    assert int(t2d.sum()) == VD and bool(t2d[ids].all())
    network, _ = load_network(env["eagle3"])
    assert torch.equal(ids, network.draft_ids)  # the same target ids the verifier drafts


def test_eagle3_weights_are_the_trained_ones(env, tmp_path):
    _, tensors = read(export(env["eagle3"], "vllm", tmp_path / "out"))
    state = load_file(env["eagle3"] / "model.safetensors")
    assert torch.equal(tensors["layers.0.self_attn.q_proj.weight"], state["layer.self_attn.q_proj.weight"])
    assert torch.equal(tensors["fc.weight"], state["fc.weight"])


def test_eagle1_bias_folded_into_embedding_is_the_same_network(env, tmp_path):
    """vLLM's EAGLE-1 fc has no bias: fc(concat(e', f)) without bias must equal fc(concat(e, f)) + b."""
    _, tensors = read(export(env["eagle1"], "vllm", tmp_path / "out"))
    state = load_file(env["eagle1"] / "model.safetensors")
    assert state["fc.bias"].abs().max() > 0.1
    e, f = state["embed_tokens.weight"][:7], torch.randn(7, H)
    ours = torch.cat([e, f], -1) @ state["fc.weight"].T + state["fc.bias"]
    theirs = torch.cat([tensors["embed_tokens.weight"][:7], f], -1) @ tensors["fc.weight"].T
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)


def test_medusa2_export_writes_the_adapted_target_its_heads_draft_for(env, tmp_path):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    t1 = env["t1"]
    peft_model = get_peft_model(
        make_llama(seed=0, layers=LAYERS), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])
    )
    state = {k: torch.randn_like(v) for k, v in get_peft_model_state_dict(peft_model).items()}
    lora = {"r": 2, "alpha": 4, "target_modules": ["q_proj"], "shapes": {k: list(v.shape) for k, v in state.items()}}
    medusa = MedusaModel(MedusaConfig(num_heads=2, num_layers=1, hidden_size=H, vocab_size=VOCAB, lora=lora))
    medusa.store_lora(state)
    save_native(medusa, t1, tmp_path / "medusa2")
    out = export(tmp_path / "medusa2", "vllm", tmp_path / "out")
    config, tensors = read(out)
    assert config["num_heads"] == 2 and not any("lora" in k for k in tensors)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = medusa.adapt_target(t1).model(ids).logits
        got = AutoModelForCausalLM.from_pretrained(out / "target")(ids).logits
        assert not torch.allclose(want, t1.model(ids).logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(DraftsmithError, match="cannot hold a medusa2 drafter; formats that can: native, vllm$"):
        export(tmp_path / "medusa2", "sglang", tmp_path / "out2")


def test_dtype_casts_weights_but_not_vocab_maps(env, tmp_path):
    config, tensors = read(export(env["eagle3"], "vllm", tmp_path / "out", dtype="bf16"))
    assert tensors["fc.weight"].dtype == torch.bfloat16 and config["torch_dtype"] == "bfloat16"
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


def test_eagle3_final_normed_feature_is_refused_for_engines(env, tmp_path):
    """HF hidden_states[L] (normed) is no engine's aux state: serving it would feed other features."""
    t = Target.from_pretrained(env["target"], feature_layers=(2, 3, 4))
    net = EagleModel(EagleConfig.from_target(t.config, 3, t.feature_layers, draft_vocab_size=VD))
    save_native(net, t, tmp_path / "final")
    for fmt in ("vllm", "sglang", "speculators"):
        with pytest.raises(DraftsmithError, match=r"final \*normed\* state"):
            export(tmp_path / "final", fmt, tmp_path / fmt)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_each_eagle3_layout_reads_back_the_feature_layers_and_layer_its_exporter_writes(env, tmp_path, fmt):
    """``eagle_layout.LAYOUTS`` is the one table both directions use: what an export writes (the decoder layer under
    its prefix, the aux ids in its numbering) the same layout reads as the drafter's HF ``hidden_states``; an SGLang
    dir carries both numberings, and either one alone reads the same layers."""
    config, tensors = read(export(env["eagle3"], fmt, tmp_path / "out"))
    layout = eagle_layout.LAYOUTS[fmt]
    assert eagle_layout.feature_layers(config, fmt, LAYERS) == (1, 2, 3)  # env's EAGLE-3 reads hidden_states 1..3
    assert {k for k in tensors if "self_attn" in k} == {f"{layout.prefix}self_attn.{p}_proj.weight" for p in "qkvo"}
    bare = {k: v for k, v in config.items() if k not in ("eagle_config", "eagle_aux_hidden_state_layer_ids")}
    written = [n for n in layout.aux_ids if n.read(config) is not None]
    assert written and written[0] == layout.aux_ids[0]
    for numbering in written:  # each place the layout reads its ids from, alone
        alone = bare | {numbering.keys[0]: config[numbering.keys[0]]}
        assert eagle_layout.feature_layers(alone, fmt, LAYERS) == (1, 2, 3), numbering
    assert eagle_layout.feature_layers(bare, fmt, LAYERS) == eagle_layout.loader_default_layers(LAYERS)


@pytest.mark.parametrize("layers", [4, 5, 8, 32])
def test_default_eagle3_feature_layers_are_servable(layers):
    """The EAGLE-3 default must be what engines capture, or a drafter trained with defaults cannot be served."""
    cfg = SimpleNamespace(feature_layers=default_feature_layers(layers, 3))
    assert eagle_layout.aux_layer_ids(cfg, layers, "vllm") == list(cfg.feature_layers)
    assert eagle_layout.aux_layer_ids(cfg, layers, "sglang") == [k - 1 for k in cfg.feature_layers]


def test_hydra_and_eagle1_speculators_are_refused_naming_formats_that_work(env, tmp_path):
    with pytest.raises(DraftsmithError, match="no serving engine loads Hydra.*formats that can: native$"):
        export(env["hydra"], "vllm", tmp_path / "a")
    with pytest.raises(DraftsmithError, match="cannot hold a eagle1 drafter; formats that can: native, vllm, sglang"):
        export(env["eagle1"], "speculators", tmp_path / "b")


def test_each_format_holds_the_families_with_a_hook_for_it_and_refuses_others_naming_theirs(env, tmp_path):
    """A format asks the drafter's family for its block (``families/<family>/export.py``, ``@exports``): it holds
    exactly the methods with a hook for it, and called for a family without one it refuses in one line naming the
    formats that family has, writing nothing."""
    assert methods("speculators") == ("dflash", "dspark", "eagle3", "peagle")
    assert methods("sglang") == ("dflash", "eagle1", "eagle3")
    assert methods("vllm") == ("dflash", "dspark", "eagle1", "eagle3", "medusa1", "medusa2", "pard", "peagle")
    assert methods("hf") == ("draft_lm",)
    assert export_formats("eagle1") == ("vllm", "sglang") and export_formats("hydra") == ()
    src = load_source(env["eagle1"])
    with pytest.raises(
        DraftsmithError, match=r"^--to speculators cannot hold a eagle1 drafter; its family exports to: vllm, sglang$"
    ):
        speculators.export(src, tmp_path / "out", None)
    with pytest.raises(
        DraftsmithError,
        match=r"^--to vllm cannot hold a hydra drafter \(no serving engine loads Hydra heads\); its family exports to: none but",
    ):
        vllm.export(load_source(env["hydra"]), tmp_path / "out", None)
    assert not (tmp_path / "out").exists()


def test_fingerprint_mismatch_is_refused(env, tmp_path):
    other = tmp_path / "other"
    model = make_llama(seed=1, layers=LAYERS)
    model.config.hidden_act = "gelu"
    model.save_pretrained(other)
    make_tokenizer().save_pretrained(other)
    with pytest.raises(DraftsmithError, match="was made for target .* differ in config_hash"):
        export(env["eagle3"], "vllm", tmp_path / "out", target=str(other))


def test_the_config_hash_outlives_a_transformers_upgrade_and_still_tells_configs_apart(monkeypatch):
    """An upgrade of transformers is not another target: the config hash leaves out the ``transformers_version``
    the config serialises. Artifacts made when the hash still covered it are recognised for the same config (that
    hash is recomputed here as they computed it, under a pretended 5.3.1) and refused for another config."""
    import hashlib

    import transformers.configuration_utils as configuration_utils

    from draftsmith.core.fingerprint import check_fingerprint

    def old_hash(config) -> str:
        cfg = {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_") and k != "dtype"}
        return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]

    model, other = make_llama(seed=0, layers=LAYERS), make_llama(seed=0, layers=LAYERS)
    other.config.rms_norm_eps = 1e-3
    fingerprint = Target(model, make_tokenizer(), name="t").fingerprint
    monkeypatch.setattr(configuration_utils, "__version__", "5.3.1")
    assert Target(model, make_tokenizer(), name="t").fingerprint == fingerprint
    assert old_hash(model.config) != fingerprint["config_hash"]
    check_fingerprint(fingerprint | {"config_hash": old_hash(model.config)}, fingerprint, "an old corpus")
    with pytest.raises(DraftsmithError, match="an old corpus was made for target .* differ in config_hash"):
        check_fingerprint(fingerprint | {"config_hash": old_hash(other.config)}, fingerprint, "an old corpus")


def test_native_round_trip_gives_identical_verifier_output(env, tmp_path, prompts):
    t3 = env["t3"]
    out = export(env["eagle3"], "native", tmp_path / "out")
    runs = []
    for path in (env["eagle3"], out):
        decoder = SpeculativeDecoder(t3, load_trained(path, t3), 3, Sampling(0.0))
        runs.append([decoder.generate(p, 12) for p in prompts[:2]])
    for a, b in zip(*runs, strict=True):
        assert a.tokens == b.tokens and a.accepted == b.accepted


def test_native_card_has_scores_and_training_command(env, tmp_path):
    src = tmp_path / "src"
    network, info = load_network(env["eagle3"])
    save_native(network, env["t3"], src, {"training_command": "draftsmith fit --config x.yaml"})
    row = {  # a row as draftsmith score saves it
        "name": str(src),
        "k": 4,
        "alpha": 0.625,
        "tau": 3.5,
        "tau_full": 3.5,
        "accept_at": [0.9, 0.5],
        "accept_given_reached": [0.9, 0.55],
        "rounds": 14,
        "target_calls": 15,
        "tokens": 48,
        "seconds": 0.32,
        "tokens_per_s": 150.0,
        "speedup": 1.5,
        "cost_ratio": 0.1,
        "mean_drafted": 4.0,
        "verify_ratio": 1.1,
        "ideal_speedup": 2.0,
        "greedy_exact": 3,
        "prompts": 3,
    }
    config = {
        "prompts": "builtin:heldout",
        "num_prompts": 3,
        "k": 4,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_new_tokens": 16,
        "seed": 0,
        "command": "draftsmith score",
    }
    plain = {"tokens": 48, "seconds": 0.48, "tokens_per_s": 100.0, "target_calls": 48}
    report = {"config": config, "target": env["t3"].fingerprint, "plain": plain, "drafters": [row]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    out = export(src, "native", tmp_path / "out", scores=[tmp_path / "report.json"])
    card = (out / "README.md").read_text()
    assert "| 0.625 | 3.50 |" in card and "draftsmith fit --config x.yaml" in card
    assert f"| `shape.hidden_size` | `{H}` |" in card and "`shape`" not in card  # the layer's shape, one per row
    config = json.loads((out / "config.json").read_text())
    assert config["training_command"] == "draftsmith fit --config x.yaml"
    assert config["target"] == info["target"] and config["method"] == "eagle3"
    report["target"] = {**report["target"], "config_hash": "0"}
    (tmp_path / "other.json").write_text(json.dumps(report))
    with pytest.raises(DraftsmithError, match="scored against target"):
        export(src, "native", tmp_path / "out2", scores=[tmp_path / "other.json"])


def test_hf_export_gives_the_same_logits(env, tmp_path):
    src = tmp_path / "draft"
    model = make_llama(seed=5, layers=1)
    model.save_pretrained(src)
    out = export(src, "hf", tmp_path / "out", target=str(env["target"]))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert (out / "tokenizer.json").is_file()


def test_hf_export_of_a_trained_lora_draft_lm_gives_its_logits(env, tmp_path):
    from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork

    base = make_llama(seed=5, layers=1)
    network = DraftLMNetwork(DraftLMConfig(base.config.to_dict(), {"r": 4, "target_modules": ["q_proj"]}), base)
    with torch.no_grad():
        for name, p in network.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_native(network, env["t1"], tmp_path / "draft")
    out = export(tmp_path / "draft", "hf", tmp_path / "out")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = network(ids)
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out)(ids).logits, want, rtol=1e-5, atol=1e-5)
    assert (out / "tokenizer.json").is_file()


def test_hf_export_merges_lora(env, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = make_llama(seed=5, layers=1)
    base.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(make_llama(seed=5, layers=1), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    peft_model.save_pretrained(tmp_path / "adapter")
    out = export(tmp_path / "adapter", "hf", tmp_path / "out", target=str(env["target"]))
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert not list(out.glob("adapter_*"))
    with torch.no_grad():
        want = peft_model(ids).logits
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out)(ids).logits, want, rtol=1e-5, atol=1e-5)


def test_cli_export_prints_the_serving_command(env, tmp_path, capsys):
    main(["export", str(env["eagle3"]), "--to", "vllm", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert '--speculative-config \'{"method": "eagle3", "model": "' in printed
    with pytest.raises(SystemExit) as e:
        main(["export", str(env["eagle3"]), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "norms", [{"fc_norm": True, "norm_output": True}, {"norm_before_fc": True}, {"norm_before_residual": True}]
)
def test_an_eagle31_drafter_exports_its_norm_flags_and_weights_or_is_refused(env, tmp_path, norms):
    """vLLM and speculators read EAGLE-3.1's flags and norm weights; an export that wrote the flags False and
    dropped the weights served another drafter without a word. SGLang reads none: refused in one line."""
    t3 = env["t3"]
    torch.manual_seed(1)
    net = EagleModel(EagleConfig.from_target(t3.config, 3, t3.feature_layers, draft_vocab_size=VD, **norms))
    net.set_draft_vocab(torch.rand(VOCAB))
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.2)  # norm weights away from their ones: a dropped weight would read back as ones
    src = save_native(net, t3, tmp_path / "e31")
    state = net.state_dict()
    norm_keys = sorted(k for k in state if k.startswith(("fc_norm.", "input_norm.")))
    assert norm_keys or norms == {"norm_before_residual": True}, "the network holds its norms' weights"
    for to in ("vllm", "speculators"):
        out = export(src, to, tmp_path / to)
        config, tensors = read(out)
        for flag in ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual"):
            assert config[flag] is norms.get(flag, False), (to, flag)
        for key in norm_keys:
            assert torch.equal(tensors[key], state[key]), (to, key)
    with pytest.raises(DraftsmithError, match=f"--to sglang: an EAGLE-3 with {', '.join(norms)}"):
        export(src, "sglang", tmp_path / "sglang")
