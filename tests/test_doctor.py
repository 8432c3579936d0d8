"""``draftsmith doctor``: a healthy EAGLE-3 drafter passes every check; each injected fault is named by its check
(feature layers recorded one off, another target, a permuted d2t), for a native dir, a ``.ckpt``-less peer export
imported on the fly, and through the CLI."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.native import save_native
from draftsmith.core.target import Target, TargetOutput
from draftsmith.eval.doctor import FAIL, INFO, NOT_RUN, PASS, probe, teacher_forced_tau
from draftsmith.families.eagle.module import eagle_losses
from draftsmith.families.eagle.network import EagleConfig, EagleModel
from draftsmith.pipeline.doctor import doctor

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = (1, 2, 3)
PROMPT = 6
NEW = 40


def words(ids: torch.Tensor) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def train_eagle3(target: Target, layers: tuple[int, ...], steps: int = 150) -> EagleModel:
    """A tiny EAGLE-3 trained with training-time test on the target's own sampled text, by the family's own loss."""
    base = target.model
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, VOCAB - 2, (64, PROMPT), generator=g)
    torch.manual_seed(0)
    ids = base.generate(prompts, max_new_tokens=NEW, do_sample=True, top_k=None, pad_token_id=0)
    torch.manual_seed(0)
    network = EagleModel(EagleConfig.from_target(base.config, 3, layers, 80))
    network.set_draft_vocab(torch.bincount(ids[:, PROMPT:].flatten(), minlength=VOCAB).float())
    network.init_from_target(base.model.embed_tokens.weight, base.lm_head.weight)
    full = target(ids, feature_layers=layers)
    loss_mask = torch.cat([torch.zeros(64, PROMPT), torch.ones(64, ids.shape[1] - PROMPT)], 1).long()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    opt = torch.optim.AdamW([p for p in network.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        rows = torch.randint(0, 64, (16,), generator=g)
        out = TargetOutput(full.logits[rows], tuple(f[rows] for f in full.features))
        loss = eagle_losses(network, {k: v[rows] for k, v in batch.items()}, out, 3)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return network.eval()


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """A saved 4-layer tiny target, prompts for it, and a healthy EAGLE-3 drafter (native, recording the val τ_est a
    fit records: the teacher-forced replay on held-out greedy text)."""
    root = tmp_path_factory.mktemp("doctor")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    target = Target.from_pretrained(root / "target")
    g = torch.Generator().manual_seed(7)
    heldout, val = torch.randint(0, VOCAB - 2, (2, 12, PROMPT), generator=g)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": words(p)}) + "\n" for p in heldout))
    network = train_eagle3(target, LAYERS)
    val_tau = teacher_forced_tau(network, probe(target, val.tolist(), NEW), 4)
    save_native(network, target, root / "healthy", {"val_tau_est": val_tau})
    return {"root": root, "target": target, "network": network, "val_tau": val_tau}


def run(case: dict, drafter: Path, target: Path | None = None, **kwargs) -> dict:
    root = case["root"]
    args = {"prompts": str(root / "prompts.jsonl"), "max_new_tokens": NEW, "out": None} | kwargs
    return doctor(drafter, str(target or root / "target"), **args)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def saved(case: dict, name: str, network: EagleModel) -> Path:
    save_native(network, case["target"], case["root"] / name, {"val_tau_est": case["val_tau"]})
    return case["root"] / name


def test_healthy_drafter_passes_every_check_and_writes_its_report(case, tmp_path, capsys):
    report = run(case, case["root"] / "healthy", out=tmp_path)
    found = checks(report)
    assert report["failed"] == [], [c["finding"] for c in report["checks"] if c["status"] != PASS]
    assert {c["status"] for c in report["checks"]} == {PASS}, report["checks"]
    assert list(found) == [
        "identity",
        "feature layers",
        "position offset",
        "training-time test",
        "draft vocabulary",
        "prediction vs measurement",
    ]
    assert found["feature layers"]["data"]["best"] == list(LAYERS)
    prediction = found["prediction vs measurement"]["data"]
    assert prediction["greedy_exact"] == 12 and prediction["tau"] > 1.3  # it learned: worth doctoring
    # the teacher-forced replay is the verifier's τ on greedy text, round for round
    assert prediction["tau_teacher_forced"] == pytest.approx(prediction["tau"], abs=1e-9)
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("PASS") for line in lines) == 6
    assert json.loads((tmp_path / "doctor.json").read_text())["checks"] == report["checks"]
    assert "| feature layers | pass |" in (tmp_path / "doctor.md").read_text()


def test_feature_layers_recorded_one_below_are_named_with_the_reading_that_accepts_best(case):
    """0- vs 1-based ids: the network trained on hidden_states (1, 2, 3) but records (0, 1, 2)."""
    network = copy.deepcopy(case["network"])
    network.cfg = dataclasses.replace(network.cfg, feature_layers=(0, 1, 2))
    found = checks(run(case, saved(case, "shifted", network)))
    layers = found["feature layers"]
    assert layers["status"] == FAIL
    assert layers["data"]["recorded"] == [0, 1, 2] and layers["data"]["best"] == list(LAYERS)
    assert "[1, 2, 3] (+1)" in layers["finding"] and "off by one" in layers["cause"]
    assert found["identity"]["status"] == PASS  # the same target: only the layer ids are wrong


def test_another_target_fails_identity_in_one_line_and_runs_nothing_it_cannot(case, capsys):
    other = case["root"] / "other"
    make_llama(seed=0, layers=4, hidden=32).save_pretrained(other)
    make_tokenizer(salt="x").save_pretrained(other)
    report = run(case, case["root"] / "healthy", target=other)
    found = checks(report)
    assert found["identity"]["status"] == FAIL and report["failed"] == ["identity"]
    assert set(found["identity"]["data"]["differs"]) >= {"hidden_size", "tokenizer_hash"}
    assert all(c["status"] == NOT_RUN for name, c in found.items() if name != "identity")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(lines) == 1 and "tokenizer" in lines[0] and "hidden size" in lines[0] and "fix:" in lines[0]


def test_permuted_d2t_fails_the_draft_vocabulary_check(case):
    network = copy.deepcopy(case["network"])
    ids = network.draft_ids.clone()
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    network.d2t.copy_(ids[perm] - torch.arange(len(ids)))  # the same token set, reordered
    found = checks(run(case, saved(case, "permuted", network)))
    vocab = found["draft vocabulary"]
    assert vocab["status"] == FAIL and "ascending" in vocab["finding"]
    assert found["prediction vs measurement"]["status"] == FAIL  # and it shows in what it accepts
    assert "draft vocabulary" in found["prediction vs measurement"]["fix"]
    # a drafter that accepts nothing at any reading has no best reading: not a pass, not a false alarm
    assert found["feature layers"]["status"] == INFO


def test_a_peer_export_is_imported_on_the_fly_and_checked_the_same(case, tmp_path, capsys):
    """The healthy drafter exported in speculators' layout, doctored from that dir through the CLI."""
    from draftsmith.export.registry import export

    peer = tmp_path / "speculators"
    export(case["root"] / "healthy", "speculators", peer, target=str(case["root"] / "target"))
    capsys.readouterr()
    main(
        [
            "doctor",
            str(peer),
            "--target",
            str(case["root"] / "target"),
            "--prompts",
            str(case["root"] / "prompts.jsonl"),
            "--max_new_tokens",
            str(NEW),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "doctor.json").read_text())
    assert report["source"] == "imported from the speculators layout"
    assert checks(report)["feature layers"]["status"] == PASS
    assert "FAIL" not in out and "PASS    feature layers" in out


def test_a_peer_checkpoint_the_importer_refuses_for_another_target_fails_identity(case, tmp_path):
    from draftsmith.export.registry import export

    other = tmp_path / "deeper"
    make_llama(seed=0, layers=2).save_pretrained(other)
    make_tokenizer().save_pretrained(other)
    peer = tmp_path / "speculators"
    export(case["root"] / "healthy", "speculators", peer, target=str(case["root"] / "target"))
    found = checks(run(case, peer, target=other))
    assert found["identity"]["status"] == FAIL and "another target" in found["identity"]["finding"]
    assert all(c["status"] == NOT_RUN for name, c in found.items() if name != "identity")
