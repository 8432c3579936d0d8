"""``draftsmith import``: EAGLE-3 checkpoints in the field's layouts -> native drafters that draft as before.

Round trips: a native EAGLE-3 (scattered draft vocabulary, perturbed weights) -> each export format -> import
gives the same training-time-test logits and target tokens (the network computes the same floats); a grouped-query
checkpoint imports exactly; greedy decoding with an imported drafter is the target's plain greedy decoding. Bad
inputs (another target, unknown layout, a missing shard, a norm flag draftsmith's layer does not compute) are one
line naming what is wrong. The peers' own code writing and reading these layouts: tests/test_peers.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, eagle3_case, make_llama, make_tokenizer
from safetensors.torch import load_file, save_file

from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.export.imports import import_drafter
from draftsmith.export.registry import write_export
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.registry import load_network, load_trained
from draftsmith.targets import resolve_target
from engines import peer_check

LAYERS, STEPS, T = [1, 2, 3], 3, 20


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    case = eagle3_case(tmp_path_factory.mktemp("import"), draft_vocab=40, length=T, layers=tuple(LAYERS))
    make_llama(seed=1, layers=4, vocab=VOCAB + 32).save_pretrained(case["root"] / "other")
    make_tokenizer(vocab=VOCAB + 32).save_pretrained(case["root"] / "other")
    return case | {"ours": logits(case["network"], case["x"], case["features"])}


def logits(network, x, features) -> peer_check.StepLogits:
    return peer_check.draftsmith_logits(network.eval(), x, features, STEPS)


def same(a: peer_check.StepLogits, b: peer_check.StepLogits) -> None:
    for j, (p, q) in enumerate(zip(a.logits, b.logits, strict=True)):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-5), f"step {j}: max diff {(p - q).abs().max():.2e}"
    for p, q in zip(a.target_tokens(), b.target_tokens(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("fmt", ["speculators", "sglang", "vllm"])
def test_export_then_import_drafts_the_same(env, fmt, tmp_path):
    write_export(env["root"] / "native", fmt, tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert info["imported_from"]["layout"] == fmt
    assert tuple(network.cfg.feature_layers) == tuple(LAYERS)
    same(env["ours"], logits(network, env["x"], env["features"]))


EAGLE31 = {"fc_norm": True, "norm_output": True, "norm_before_residual": True}


@pytest.fixture(scope="module", params=[1, 2], ids=["eagle31", "eagle31-2layer"])
def eagle31(request, tmp_path_factory) -> dict:
    """An EAGLE-3.1 (its norms perturbed away from 1; the residual normed, as speculators trains by default) with one
    or two decoder layers, and its TTT logits."""
    root = tmp_path_factory.mktemp(f"import31-{request.param}")
    case = eagle3_case(root, draft_vocab=40, length=T, layers=tuple(LAYERS), **EAGLE31, num_layers=request.param)
    return case | {"ours": logits(case["network"], case["x"], case["features"])}


@pytest.mark.parametrize("fmt", ["speculators", "vllm"])
def test_an_eagle31_export_imports_back_with_its_norms_and_layers_drafting_the_same(eagle31, fmt, tmp_path):
    num_layers = eagle31["network"].cfg.num_layers
    if fmt == "speculators" and num_layers > 1:
        pytest.skip("a stack exports --to vllm only (tests/test_eagle_layers.py checks the refusal)")
    write_export(eagle31["root"] / "native", fmt, tmp_path / "export")
    import_drafter(tmp_path / "export", str(eagle31["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert info["imported_from"]["layout"] == fmt
    cfg = network.cfg
    assert (cfg.fc_norm, cfg.norm_output, cfg.norm_before_residual, cfg.num_layers) == (True, True, True, num_layers)
    state = network.state_dict()
    assert all(torch.equal(state[k], v) for k, v in eagle31["network"].state_dict().items()), fmt
    same(eagle31["ours"], logits(network, eagle31["x"], eagle31["features"]))


def test_stacks_and_norms_draftsmith_does_not_compute_are_refused_in_one_line(eagle31, env, tmp_path):
    """EAGLE-3.1 flags in SGLang's layout (SpecForge's norm_output means another thing), a stack with a gap, and a
    P-EAGLE with EAGLE-3.1's norms are one line each."""
    write_export(env["root"] / "native", "sglang", tmp_path / "sglang")
    for flag in ("fc_norm", "norm_before_residual"):
        edit_config(tmp_path / "sglang", **{flag: True})
        with pytest.raises(DraftsmithError, match=rf"{flag}=True: the sglang layout's EAGLE-3 has no such norm"):
            import_drafter(tmp_path / "sglang", str(env["root"] / "target"), tmp_path / "out-a")
        edit_config(tmp_path / "sglang", **{flag: False})
    if eagle31["network"].cfg.num_layers == 1:
        assert "a P-EAGLE with EAGLE-3.1's norms" in broken(
            env,
            tmp_path / "b",
            lambda s: edit_config(s, speculators_model_type="peagle"),
            native=eagle31["root"] / "native",
        )
        return
    write_export(eagle31["root"] / "native", "vllm", tmp_path / "gap")
    state = load_file(tmp_path / "gap" / "model.safetensors")
    save_file(
        {k.replace("layers.1.", "layers.2."): v for k, v in state.items()}, tmp_path / "gap" / "model.safetensors"
    )
    with pytest.raises(DraftsmithError, match=r"decoder layers layers\.2 beside layers\.0\.\*"):
        import_drafter(tmp_path / "gap", str(eagle31["root"] / "target"), tmp_path / "out-c")


@pytest.mark.parametrize(
    ("mask_from_token", "fmt"), [(False, "vllm"), (True, "vllm"), (True, "sglang"), (True, "speculators")]
)
def test_a_dflash_export_imports_back_drafting_the_same(env, mask_from_token, fmt, tmp_path):
    """DFlash -> z-lab's layout (the vllm and sglang exports) or speculators' -> import: the same logits at every
    anchor's masks; a learned mask comes back from the export's mask_embedding.pt, a token's mask as that token's
    embedding."""
    from draftsmith.core.native import save_native
    from draftsmith.families.dflash.module import DFlashModule

    module = DFlashModule(
        str(env["root"] / "target"), LAYERS, depth=3, mask_token_id=VOCAB - 3, mask_from_token=mask_from_token
    )
    torch.manual_seed(3)
    with torch.no_grad():
        for p in module.drafter.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    save_native(module.drafter, module.target, tmp_path / "native")
    write_export(tmp_path / "native", fmt, tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    layout = "speculators" if fmt == "speculators" else "z-lab"
    assert info["imported_from"]["layout"] == layout and network.cfg.mask_from_token == mask_from_token
    ours = peer_check.draftsmith_dflash_logits(module.drafter.eval(), env["x"], env["features"], 3)
    same(ours, peer_check.draftsmith_dflash_logits(network.eval(), env["x"], env["features"], 3))


def test_an_imported_dflash_is_where_fit_starts(env, tmp_path):
    """``model.init`` of a DFlash: training goes on from the imported network (layers, feature layers, mask token,
    mask kind) as it is; a drafter of another family is one line."""
    from draftsmith.core.native import save_native
    from draftsmith.families.dflash.module import DFlashModule

    module = DFlashModule(str(env["root"] / "target"), LAYERS, depth=3, mask_token_id=VOCAB - 3, mask_from_token=True)
    save_native(module.drafter, module.target, tmp_path / "native")
    write_export(tmp_path / "native", "speculators", tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    imported, _ = load_network(tmp_path / "imported")
    start = DFlashModule(str(env["root"] / "target"), depth=3, init=str(tmp_path / "imported")).drafter
    assert tuple(start.cfg.feature_layers) == tuple(LAYERS) and start.cfg.mask_token_id == VOCAB - 3
    assert start.cfg.mask_from_token and all(
        torch.equal(v, imported.state_dict()[k]) for k, v in start.state_dict().items()
    )
    with pytest.raises(DraftsmithError, match="holds a eagle3 drafter, not dflash"):
        DFlashModule(str(env["root"] / "target"), init=str(env["root"] / "native"))


def test_a_grouped_query_checkpoint_imports_exactly(env, tmp_path):
    """Pairs of heads sharing k/v weights, written as a 2-kv-head checkpoint: the import repeats them back."""
    src = tmp_path / "gqa"
    write_export(env["root"] / "native", "vllm", src)
    state = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    heads, hd = config["num_attention_heads"], config["head_dim"]
    for proj in ("k_proj", "v_proj"):  # keep every other head: the checkpoint's grouped weights
        w = state[f"layers.0.self_attn.{proj}.weight"].view(heads, hd, -1)
        state[f"layers.0.self_attn.{proj}.weight"] = w[::2].reshape(heads // 2 * hd, -1).contiguous()
    save_file(state, src / "model.safetensors")
    config["num_key_value_heads"] = heads // 2
    (src / "config.json").write_text(json.dumps(config))
    import_drafter(src, str(env["root"] / "target"), tmp_path / "imported")
    network, _ = load_network(tmp_path / "imported")
    # the same network with each head pair sharing the even head's k/v
    expected, _ = load_network(env["root"] / "native")
    with torch.no_grad():
        for proj in (expected.layer.self_attn.k_proj, expected.layer.self_attn.v_proj):
            w = proj.weight.view(heads, hd, -1)
            w[1::2] = w[::2].clone()
    same(logits(expected, env["x"], env["features"]), logits(network, env["x"], env["features"]))


def test_an_imported_drafter_decodes_exactly_under_the_verifier(env, tmp_path):
    write_export(env["root"] / "native", "speculators", tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    target = Target.from_pretrained(env["root"] / "target")
    drafter = load_trained(tmp_path / "imported", target)
    decoder = SpeculativeDecoder(target, drafter, k=3, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        plain = plain_decode(target, prompt, 24, Sampling(0.0), None).tokens
        assert decoder.generate(prompt, 24).tokens == plain


def broken(env, tmp_path, edit, native=None) -> str:
    src = tmp_path / "src"
    write_export(native or env["root"] / "native", "speculators", src)
    edit(src)
    with pytest.raises(DraftsmithError) as e:
        import_drafter(src, str(env["root"] / "target"), tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    return str(e.value)


def edit_config(src, **changes) -> None:
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **changes}))


def test_a_checkpoint_for_another_target_is_one_line_naming_what_differs(env, tmp_path):
    write_export(env["root"] / "native", "sglang", tmp_path / "src")
    with pytest.raises(DraftsmithError, match=rf"another target: vocabulary {VOCAB} vs the target's {VOCAB + 32}"):
        import_drafter(tmp_path / "src", str(env["root"] / "other"), tmp_path / "out")


def test_bad_checkpoints_are_one_line_each(env, tmp_path):

    def llama3_rope(src):
        layer = json.loads((src / "config.json").read_text())["transformer_layer_config"]
        edit_config(src, transformer_layer_config={**layer, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}})

    assert "rope_type 'llama3'" in broken(env, tmp_path / "b", llama3_rope)

    def unknown(src):
        config = json.loads((src / "config.json").read_text())
        config.pop("speculators_model_type")
        (src / "config.json").write_text(json.dumps(config))
        state = load_file(src / "model.safetensors")
        save_file({k.replace("layers.0.", "blocks.0."): v for k, v in state.items()}, src / "model.safetensors")

    assert "unknown drafter layout" in broken(env, tmp_path / "c", unknown)

    def sharded(src):
        state = load_file(src / "model.safetensors")
        names = sorted(state)
        half = len(names) // 2
        save_file({k: state[k] for k in names[:half]}, src / "model-00001-of-00002.safetensors")
        (src / "model.safetensors").unlink()
        weight_map = {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors" for i, k in enumerate(names)}
        (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    assert "missing shard(s), e.g. model-00002-of-00002.safetensors" in broken(env, tmp_path / "d", sharded)
    assert "not valid JSON" in broken(env, tmp_path / "e", lambda s: (s / "config.json").write_text("{"))
    shutil.rmtree(tmp_path / "e")


def test_bad_dflash_checkpoints_are_one_line_each(env, tmp_path):
    """What draftsmith's DFlash does not compute is refused with one line naming the field."""
    from draftsmith.core.native import save_native
    from draftsmith.families.dflash.module import DFlashModule

    module = DFlashModule(str(env["root"] / "target"), LAYERS, depth=3, mask_token_id=VOCAB - 3, mask_from_token=True)
    native = tmp_path / "native"
    save_native(module.drafter, module.target, native)
    edits = {
        "sample_from_anchor=true": lambda s: edit_config(s, sample_from_anchor=True),
        f"a 40-token draft vocabulary; draftsmith's DFlash drafts over the target's whole {VOCAB}": lambda s: (
            edit_config(s, draft_vocab_size=40)
        ),
        "needs its feature layers, mask_token_id and block_size >= 2": lambda s: edit_config(s, block_size=None),
    }
    for i, (line, edit) in enumerate(edits.items()):
        assert line in broken(env, tmp_path / str(i), edit, native)


@pytest.fixture(scope="module")
def peagle(env) -> Path:
    """A native P-EAGLE for the same target (scattered draft vocabulary, perturbed weights and placeholder feature)."""
    from draftsmith.core.native import save_native
    from draftsmith.families.eagle.peagle.module import PEagleModule

    module = PEagleModule(str(env["root"] / "target"), LAYERS, draft_vocab_size=40, depth=3, mask_token_id=VOCAB - 3)
    torch.manual_seed(4)
    with torch.no_grad():
        module.drafter.set_draft_vocab(torch.rand(VOCAB))
        for name, p in module.drafter.named_parameters():
            if name != "embed_tokens.weight":
                p.add_(0.3 * torch.randn_like(p))
    save_native(module.drafter, module.target, env["root"] / "native-peagle")
    return env["root"] / "native-peagle"


def peagle_logits(network, env) -> peer_check.StepLogits:
    return peer_check.draftsmith_parallel_logits(network.eval(), env["x"], env["features"], 3)


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_a_peagle_export_imports_back_drafting_the_same(env, peagle, fmt, tmp_path):
    """P-EAGLE -> vLLM's layout (SpecForge's too) or speculators' -> import: a peagle drafter with the same depth,
    placeholder token and logits at every depth (an EAGLE-3 import would drop the placeholder feature)."""
    write_export(peagle, fmt, tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    original, _ = load_network(peagle)
    assert info["imported_from"]["layout"] == fmt and network.method == "peagle"
    assert (network.cfg.depth, network.cfg.mask_token_id) == (3, VOCAB - 3)
    same(peagle_logits(original, env), peagle_logits(network, env))


def test_specforges_peagle_layout_imports_with_its_capture_layers_and_default_depth(env, peagle, tmp_path):
    """SpecForge's own save (architectures PEagleDraftModel, no vLLM keys): the capture layers from eagle_config
    (SGLang numbering), the depth SpecForge trains by default (none recorded); without the placeholder token one line
    says where to put it."""
    src = tmp_path / "specforge"
    write_export(peagle, "vllm", src)
    config = json.loads((src / "config.json").read_text())
    for key in ("pard_token", "num_depths", "eagle_aux_hidden_state_layer_ids"):
        config.pop(key)
    (src / "config.json").write_text(json.dumps(config | {"architectures": ["PEagleDraftModel"]}))
    import_drafter(src, str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert info["imported_from"]["layout"] == "specforge" and tuple(network.cfg.feature_layers) == tuple(LAYERS)
    assert network.cfg.depth == 8
    original, _ = load_network(peagle)
    same(peagle_logits(original, env), peagle_logits(network, env))
    config.pop("mask_token_id")
    (src / "config.json").write_text(json.dumps(config | {"architectures": ["PEagleDraftModel"]}))
    with pytest.raises(DraftsmithError, match=r'without its placeholder token: add "mask_token_id": ID to its config'):
        import_drafter(src, str(env["root"] / "target"), tmp_path / "out")


def test_bad_peagle_checkpoints_are_one_line_each(env, peagle, tmp_path):
    def second_layer(src):
        state = load_file(src / "model.safetensors")
        state |= {k.replace("layers.0.", "layers.1."): v.clone() for k, v in state.items() if k.startswith("layers.0.")}
        save_file(state, src / "model.safetensors")

    def no_mask_hidden(src):
        state = load_file(src / "model.safetensors")
        save_file({k: v for k, v in state.items() if k != "mask_hidden"}, src / "model.safetensors")

    edits = {
        "a P-EAGLE with 2 decoder layers (layers.1.*); draftsmith's P-EAGLE has one": second_layer,
        "a P-EAGLE checkpoint without its mask_hidden tensor": no_mask_hidden,
    }
    for i, (line, edit) in enumerate(edits.items()):
        src = tmp_path / str(i)
        write_export(peagle, "vllm", src)
        edit(src)
        with pytest.raises(DraftsmithError) as e:
            import_drafter(src, str(env["root"] / "target"), tmp_path / f"out{i}")
        assert line in str(e.value) and "\n" not in str(e.value)


def test_a_pard_draft_lm_as_vllm_serves_it_imports_and_decodes_exactly(env, tmp_path):
    """PARD -> the vLLM export (an HF causal LM with pard_token, as AMD releases PARD) -> import: a pard drafter with
    the same placeholder, depth and logits, decoding exactly under the verifier, and fit's start (``model.init``)
    as it is; a placeholder outside the vocabulary and a draft LM for another vocabulary are one line each."""
    from draftsmith.core.native import save_native
    from draftsmith.families.pard.module import PardModule

    module = PardModule(str(env["root"] / "target"), depth=3, mask_token_id=VOCAB - 3)
    save_native(module.drafter, module.target, tmp_path / "native")
    write_export(tmp_path / "native", "vllm", tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert network.method == "pard" and info["imported_from"]["layout"] == "vllm"
    assert (network.cfg.mask_token_id, network.cfg.depth) == (VOCAB - 3, 3)
    ids = env["x"]
    torch.testing.assert_close(network.model.eval()(ids).logits, module.drafter.model.eval()(ids).logits)
    target = Target.from_pretrained(env["root"] / "target")
    decoder = SpeculativeDecoder(target, load_trained(tmp_path / "imported", target), k=3, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens
    tuned = PardModule(str(env["root"] / "target"), init=str(tmp_path / "imported"), depth=3).drafter  # fit's start
    assert tuned.cfg.mask_token_id == VOCAB - 3  # the release's placeholder, its embedding row as trained
    assert all(torch.equal(v, network.state_dict()[k]) for k, v in tuned.state_dict().items())
    edit_config(tmp_path / "export", pard_token=VOCAB + 5)
    with pytest.raises(DraftsmithError, match=rf"pard_token {VOCAB + 5} is not a token id below the vocabulary"):
        import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "out")
    edit_config(tmp_path / "export", pard_token=VOCAB - 3)
    with pytest.raises(DraftsmithError, match=rf"another target: vocabulary {VOCAB} vs the target's {VOCAB + 32}"):
        import_drafter(tmp_path / "export", str(env["root"] / "other"), tmp_path / "out")


def test_an_imported_drafter_is_fine_tuned_from_its_own_weights(env, tmp_path):
    """``model.init``: training starts from the imported network (its layer shape, feature layers, draft vocabulary)
    and moves it; a drafter of another family is one line."""
    import lightning as L

    from draftsmith.data.generate import generate
    from draftsmith.layers.module import OptimConfig
    from draftsmith.train.data import GeneratedDataModule

    write_export(env["root"] / "native", "sglang", tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    start, _ = load_network(tmp_path / "imported")
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(8))
    )
    generate(
        resolve_target(str(env["root"] / "target")), str(tmp_path / "p.jsonl"), tmp_path / "data", max_new_tokens=12
    )
    module = EagleModule(str(env["root"] / "target"), 3, init=str(tmp_path / "imported"), optim=OptimConfig(lr=1e-2))
    before = {k: v.clone() for k, v in module.drafter.state_dict().items()}
    assert all(torch.equal(before[k], v) for k, v in start.state_dict().items())
    data = GeneratedDataModule(str(tmp_path / "data"), str(tmp_path / "data"), batch_size=4, max_length=32)
    L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, default_root_dir=tmp_path).fit(module, data)  # fmt: skip
    after = module.drafter.state_dict()
    assert torch.equal(after["d2t"], before["d2t"]), "the imported draft vocabulary was replaced"
    assert not torch.equal(after["fc.weight"], before["fc.weight"]), "training did not move the imported network"
    with pytest.raises(DraftsmithError, match="holds a eagle3 drafter, not eagle1"):
        EagleModule(str(env["root"] / "target"), 1, init=str(tmp_path / "imported"))


class ResBlock(torch.nn.Module):
    """The Medusa repository's block (medusa_model.py): x + SiLU(linear(x))."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def test_medusa_heads_in_the_medusa_repositorys_layout_import_with_their_logits(env, tmp_path):
    """``medusa_head = ModuleList(Sequential(ResBlock x layers, Linear(H, V, bias=False)))`` saved as the repository
    saves it (``medusa_lm_head.pt`` + ``config.json``): imported, draftsmith's heads give its logits, decode exactly,
    and are where fit starts (``model.init``)."""
    torch.manual_seed(0)
    hidden, heads, layers = 64, 3, 2
    medusa = torch.nn.ModuleList(
        torch.nn.Sequential(*[ResBlock(hidden) for _ in range(layers)], torch.nn.Linear(hidden, VOCAB, bias=False))
        for _ in range(heads)
    )
    src = tmp_path / "medusa"
    src.mkdir()
    torch.save(medusa.state_dict(), src / "medusa_lm_head.pt")
    (src / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    import_drafter(src, str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert info["method"] == "medusa1" and info["imported_from"]["layout"] == "medusa"
    h = torch.randn(2, 5, hidden)
    with torch.no_grad():
        assert torch.allclose(network(h), torch.stack([head(h) for head in medusa]), atol=1e-5)
    target = Target.from_pretrained(env["root"] / "target")
    decoder = SpeculativeDecoder(target, load_trained(tmp_path / "imported", target), k=3, sampling=Sampling(0.0))
    assert decoder.generate([5, 9, 14, 2], 16).tokens == plain_decode(target, [5, 9, 14, 2], 16, Sampling(0.0)).tokens
    with pytest.raises(DraftsmithError, match="another target: LM head"):
        import_drafter(src, str(env["root"] / "other"), tmp_path / "other")
    from draftsmith.families.medusa.module import MedusaModule

    start = MedusaModule(str(env["root"] / "target"), init=str(tmp_path / "imported")).drafter  # fit's start
    assert (start.cfg.num_heads, start.cfg.num_layers) == (heads, layers)
    assert all(torch.equal(v, network.state_dict()[k]) for k, v in start.state_dict().items())
    with pytest.raises(DraftsmithError, match="holds a eagle3 drafter, not medusa1"):
        MedusaModule(str(env["root"] / "target"), init=str(env["root"] / "native"))


def test_medusa_heads_exported_for_vllm_import_back_with_the_same_logits(env, tmp_path):
    """Medusa -> vLLM's ``MedusaModel`` layout -> import: the same heads (biases included, as the export says with
    ``medusa_fc_bias``); without that flag vLLM's blocks have no bias, so neither has the import; a reduced
    (truncated) vocabulary is one line."""
    from draftsmith.core.native import save_native
    from draftsmith.families.medusa.module import MedusaModule

    module = MedusaModule(str(env["root"] / "target"), num_heads=3, num_layers=2)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in module.drafter.parameters():
            p.add_(0.3 * torch.randn_like(p))
    save_native(module.drafter, module.target, tmp_path / "native")
    write_export(tmp_path / "native", "vllm", tmp_path / "export")
    import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "imported")
    network, info = load_network(tmp_path / "imported")
    assert info["method"] == "medusa1" and info["imported_from"]["layout"] == "vllm"
    h = torch.randn(2, 5, module.target.hidden_size)
    with torch.no_grad():
        assert torch.allclose(network(h), module.drafter(h), atol=1e-6)
        edit_config(tmp_path / "export", medusa_fc_bias=False)
        import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "unbiased")
        unbiased, _ = load_network(tmp_path / "unbiased")
        for name, p in module.drafter.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
        assert torch.allclose(unbiased(h), module.drafter(h), atol=1e-6)
    edit_config(tmp_path / "export", truncated_vocab_size=VOCAB - 8)
    with pytest.raises(DraftsmithError, match=rf"truncated_vocab_size {VOCAB - 8} < vocab_size {VOCAB}"):
        import_drafter(tmp_path / "export", str(env["root"] / "target"), tmp_path / "out")


def test_an_import_records_the_dtype_its_target_spec_computes_in(env, tmp_path):
    """``--target DIR:bfloat16`` (or ``--dtype``) records bfloat16, so ``score`` with the same spec takes the drafter;
    ``auto`` records what every command resolves it to (here a checkpoint released in bfloat16: bf16 where this CPU
    multiplies it natively)."""
    from draftsmith.targets import load_target, parse_target, target_dtype

    target = env["root"] / "target"
    write_export(env["root"] / "native", "speculators", tmp_path / "export")
    import_drafter(tmp_path / "export", f"{target}:bfloat16", tmp_path / "bf16")
    _, info = load_network(tmp_path / "bf16")
    assert info["target"]["dtype"] == "bfloat16"
    load_trained(
        tmp_path / "bf16", load_target(resolve_target(f"{target}:bfloat16"))
    )  # what score does: no dtype mismatch
    import_drafter(tmp_path / "export", f"{target}:bfloat16", tmp_path / "f32", dtype="float32")  # --dtype wins
    assert load_network(tmp_path / "f32")[1]["target"]["dtype"] == "float32"
    released = tmp_path / "released-bf16"
    shutil.copytree(target, released)
    edit_config(released, torch_dtype="bfloat16")
    import_drafter(tmp_path / "export", str(released), tmp_path / "auto")
    assert load_network(tmp_path / "auto")[1]["target"]["dtype"] == target_dtype(parse_target(released), released)
