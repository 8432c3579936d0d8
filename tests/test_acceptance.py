"""SpecDec++ acceptance head: it learns to predict rejections, adaptive K keeps greedy output exact and
shortens drafts, checkpoints load through ``--drafter``, bad input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
import yaml
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.native import save_native
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.acceptance_head.module import (
    AcceptanceHeadModule,
    validation_metrics,
    weighted_bce,
)
from draftsmith.families.acceptance_head.network import AdaptiveDrafter
from draftsmith.families.acceptance_head.train import train_head
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.registry import load_network
from draftsmith.families.specs import load_drafter
from draftsmith.layers.causal_lm import DraftLMConfig, DraftLMNetwork
from draftsmith.layers.module import OptimConfig
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule

ROOT = Path(__file__).parent.parent
K = 5


pytestmark = pytest.mark.usefixtures("one_thread")


def trainer(steps: int) -> L.Trainer:
    flags = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(accelerator="cpu", max_steps=steps, max_epochs=-1, **flags)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A tiny 4-layer target, greedy data from it, a briefly trained EAGLE-1 drafter and a head on it."""
    root = tmp_path_factory.mktemp("accept")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 96), ("val", 24)]:
        rows = [
            " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (2 + j % 7,), generator=g).tolist()) for j in range(n)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": r}) + "\n" for r in rows))
        generate(resolve_target(str(root / "target")), str(root / f"{name}.jsonl"), root / f"data-{name}", temperature=0.0,
                 max_new_tokens=24, device="cpu")  # fmt: skip
    data = GeneratedDataModule(str(root / "data-train"), str(root / "data-val"), batch_size=8, max_length=64)
    torch.manual_seed(0)
    eagle = EagleModule(str(root / "target"), version=1, optim=OptimConfig(lr=3e-3, warmup_steps=5))
    trainer(40).fit(eagle, data)
    save_native(eagle.drafter, eagle.target, root / "eagle1")
    torch.manual_seed(1)
    other = EagleModule(str(root / "target"), version=1)  # an untrained EAGLE-1: another drafter
    save_native(other.drafter, other.target, root / "other-eagle1")
    torch.manual_seed(0)
    head, metrics = train_head(str(root / "target"), str(root / "eagle1"), str(root / "data-train"),
                               str(root / "data-val"), root / "head", max_steps=60, max_length=64, steps=K)  # fmt: skip
    (root / "head-metrics.json").write_text(json.dumps(metrics))
    return {
        k: root / k
        for k in (
            "target",
            "data-train",
            "data-val",
            "eagle1",
            "other-eagle1",
            "head",
            "head-metrics.json",
            "val.jsonl",
        )
    }


def val_prompts(setup) -> list[list[int]]:
    return [r["input_ids"][: r["prompt_len"]] for r in datasets.load_from_disk(str(setup["data-val"]))]


def test_weighted_bce_up_weights_rejections():
    z = torch.tensor([2.0, 2.0, -1.0])
    y = torch.tensor([1.0, 0.0, 0.3])
    plain = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="none")
    assert torch.allclose(weighted_bce(z, y, 1.0), plain)
    by_hand = -(
        0.3 * torch.log(torch.sigmoid(torch.tensor(-1.0))) + 3 * 0.7 * torch.log(1 - torch.sigmoid(torch.tensor(-1.0)))
    )
    assert weighted_bce(z, y, 3.0)[2] == pytest.approx(float(by_hand), rel=1e-5)
    assert weighted_bce(z, y, 3.0)[1] == pytest.approx(3 * float(plain[1]), rel=1e-5)


@pytest.mark.slow
def test_head_predicts_rejections_on_held_out_data(setup):
    metrics = json.loads(setup["head-metrics.json"].read_text())
    assert 0.1 < metrics["accept_rate"] < 0.9  # both classes are present in the held-out examples
    assert metrics["auroc"] > 0.7

    # an untrained head of the same shape ranks no better than chance
    torch.manual_seed(0)
    fresh = AcceptanceHeadModule(str(setup["target"]), str(setup["eagle1"]), steps=K)
    data = GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), batch_size=8, max_length=64)
    data.setup()
    parts = [tuple(t.detach() for t in fresh.examples(b, fresh.target_forward(b))) for b in data.val_dataloader()]
    assert validation_metrics(parts, 3.0)["auroc"] < metrics["auroc"] - 0.1


@pytest.mark.slow
def test_adaptive_k_keeps_greedy_output_exact_and_shortens_drafts(setup):
    target = Target.from_pretrained(setup["target"])
    drafters = {
        "fixed": load_drafter(str(setup["eagle1"]), target),
        "never-stops": load_drafter(f"adaptive:1:{setup['head']}", target),
        "adaptive": load_drafter(f"adaptive:0.3:{setup['head']}", target),
        "eager": load_drafter(f"adaptive:0.02:{setup['head']}", target),
    }
    prompts = val_prompts(setup)[:12]
    _, rows = score_drafters(target, drafters, prompts, K, Sampling(0.0), 24, progress=False)
    by = {r.name: r for r in rows}
    for row in rows:  # the verifier's output is plain greedy decoding, token for token, for every prompt
        assert row.greedy_exact == len(prompts), row.name
    # threshold 1 never stops early: exactly the base drafter's rounds
    assert by["never-stops"].mean_drafted == by["fixed"].mean_drafted
    assert by["never-stops"].accept_at == by["fixed"].accept_at
    # a low threshold really cuts drafts, and cutting where rejections are predicted raises α
    assert by["adaptive"].mean_drafted < by["fixed"].mean_drafted - 0.5
    assert by["eager"].mean_drafted < by["adaptive"].mean_drafted
    assert by["adaptive"].alpha > by["fixed"].alpha


@pytest.mark.slow
def test_head_checkpoint_scores_through_the_cli(setup, tmp_path):
    main(["score", f"--target={setup['target']}", "--drafter", f"head={setup['head']}", f"adaptive:0.3:{setup['head']}",
          "--prompts", str(setup["val.jsonl"]), "--num-prompts", "3", "--max-new-tokens", "12", "-k", str(K),
          "--out", str(tmp_path)])  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert [d["greedy_exact"] for d in report["drafters"]] == [3, 3]
    network, info = load_network(setup["head"], Target.from_pretrained(setup["target"]))
    assert info["method"] == "acceptance_head" and network.cfg.drafter_method == "eagle1"
    assert not any(p.requires_grad for p in network.base.parameters())


def test_bad_threshold_is_a_one_line_error(setup, capsys):
    for spec in (f"adaptive:1.5:{setup['head']}", f"adaptive:-0.1:{setup['head']}", f"adaptive:high:{setup['head']}"):
        with pytest.raises(SystemExit) as exc:
            main(["score", f"--target={setup['target']}", "--drafter", spec, "--num-prompts", "1"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "draftsmith: error:" in err and "[0, 1]" in err and "Traceback" not in err


def test_head_for_another_drafter_or_target_is_refused(setup, tmp_path, capsys):
    target = Target.from_pretrained(setup["target"])
    head, _ = load_network(setup["head"], target)
    other = load_drafter(str(setup["other-eagle1"]), target)
    with pytest.raises(DraftsmithError, match="trained on a eagle1 drafter with weights hash"):
        AdaptiveDrafter(other, head, 0.5)
    with pytest.raises(DraftsmithError, match="not an acceptance head"):
        load_drafter(f"adaptive:0.5:{setup['eagle1']}", target)

    other_target = make_llama(seed=1, layers=4)
    other_target.config.hidden_act = "gelu"  # same shapes, another model
    other_target.save_pretrained(tmp_path / "other-target")
    make_tokenizer().save_pretrained(tmp_path / "other-target")
    with pytest.raises(SystemExit) as exc:
        main(["score", f"--target={tmp_path / 'other-target'}", "--drafter", str(setup["head"]), "--num-prompts", "1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "config_hash" in err and "Traceback" not in err


def test_recipe_loads_through_the_fit_parser(setup, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", f"--config={ROOT / 'configs' / 'acceptance_head.yaml'}", "--print_config",
              f"--model.init_args.target={setup['target']}", f"--model.init_args.drafter={setup['eagle1']}"])  # fmt: skip
    assert exc.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["class_path"] == "draftsmith.families.acceptance_head.module.AcceptanceHeadModule"
    monitors = [c["init_args"].get("monitor") for c in config["trainer"]["callbacks"]]
    assert "val/auroc" in monitors


@pytest.mark.slow
def test_head_on_a_draft_lm_keeps_greedy_output_exact(setup, tmp_path):
    target = Target.from_pretrained(setup["target"])
    lm = make_llama(seed=3, layers=1)
    hf_config = json.loads(lm.config.to_json_string(use_diff=False))
    save_native(DraftLMNetwork(DraftLMConfig(hf_config, None), lm), target, tmp_path / "lm")
    head, _ = train_head(str(setup["target"]), str(tmp_path / "lm"), str(setup["data-train"]), str(setup["data-val"]),
                         tmp_path / "head", max_steps=10, max_length=64)  # fmt: skip
    drafters = {
        "lm": load_drafter(str(tmp_path / "lm"), target),
        "adaptive": load_drafter(f"adaptive:0.3:{head}", target),
    }
    rows = score_drafters(target, drafters, val_prompts(setup)[:6], K, Sampling(0.0), 24, progress=False)[1]
    assert [r.greedy_exact for r in rows] == [6, 6]
    assert rows[1].mean_drafted < rows[0].mean_drafted  # an untrained draft LM is rejected: the head cuts


def test_sampling_labels_are_the_probability_the_drafted_token_is_kept(setup):
    module = AcceptanceHeadModule(str(setup["target"]), str(setup["eagle1"]), steps=2, temperature=1.0)
    data = GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), batch_size=4, max_length=64)
    data.setup()
    batch = next(iter(data.val_dataloader()))
    out = module.target_forward(batch)
    hidden, logits, label, mask = next(module._drafted(batch, out))
    # step 0 from anchor 3 proposes x_5, which the target's row 4 predicts
    p, q = torch.softmax(out.logits[0, 4], -1), torch.softmax(logits[0, 3], -1)
    assert float(label[0, 3]) == pytest.approx(float(torch.minimum(p, q).sum()), rel=1e-5)
    assert float(label[mask].min()) > 0 and float(label[mask].max()) < 1  # soft, not 0/1
