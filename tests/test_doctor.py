"""``draftsmith doctor``: a healthy EAGLE-3 drafter passes every check; each injected fault is named by its check
(feature layers recorded one off, a norm flag flipped in the record, labels shifted by one, no training-time test,
training data outside the target's chat template, another target, a permuted d2t, a draft vocabulary too small or
counted on other text), for a native dir, a ``.ckpt``-less peer export imported on the fly, and through the CLI with
its exit status.

Two targets: a random Llama (``case``), and one trained on a second-order rule language (``rule_case``), whose text
the position offset and training-time test checks can tell apart (on the random one's, x(t+2) and x(t+3) are
equally unpredictable from a drafter's inputs and the target's features add little at depth 1)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.manifest import write_manifest
from draftsmith.core.native import save_native
from draftsmith.core.target import Target, TargetOutput
from draftsmith.data.generate import generate
from draftsmith.data.shards import load_generated
from draftsmith.eval.doctor import FAIL, INFO, NORM_FLAGS, NOT_RUN, PASS, probe, teacher_forced_tau
from draftsmith.families.eagle.config import EagleConfig
from draftsmith.families.eagle.module import eagle_losses
from draftsmith.families.eagle.network import EagleModel
from draftsmith.layers.module import shift
from draftsmith.pipeline.doctor import diagnose
from draftsmith.targets import resolve_target

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = (1, 2, 3)
PROMPT = 6
NEW = 40
TEMPLATE = "{% for m in messages %}w80 {{ m['content'] }} w81{% endfor %}"
"""The tiny target's chat template: a user turn is ``w80 TEXT w81``."""


def words(ids: torch.Tensor) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def make_data(root: Path, name: str, chat_template: bool) -> Path:
    """64 chat prompts of random words continued by the target (sampled), by ``draftsmith generate``: in the
    target's chat template or (``chat_template`` False) raw."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, VOCAB - 2, (64, PROMPT), generator=g)
    source = root / f"{name}.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": words(p)}]}) + "\n" for p in prompts]
    source.write_text("".join(lines))
    out = root / name
    generate(
        resolve_target(str(root / "target")),
        str(source),
        out,
        max_new_tokens=NEW,
        chat_template=chat_template,
        device="cpu",
    )
    return out


def train_eagle3(
    target: Target, data: Path, layers: tuple[int, ...] = LAYERS, steps: int = 150, ttt: int = 3, offset: int = 0
) -> EagleModel:
    """A tiny EAGLE-3 trained on a generated data dir by the family's own loss: with training-time test over
    ``ttt`` steps, against labels ``offset`` places after their own (0: the right ones)."""
    dataset, _ = load_generated(data)
    ids = torch.tensor(dataset["input_ids"], dtype=torch.long)
    loss_mask = torch.tensor(dataset["loss_mask"], dtype=torch.long)
    rows = len(ids)
    torch.manual_seed(0)
    network = EagleModel(EagleConfig.from_target(target.config, 3, layers, 80))
    network.set_draft_vocab(torch.bincount(ids[loss_mask.bool()], minlength=VOCAB).float())
    network.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    full = target(ids, feature_layers=layers)
    logits = shift(full.logits, offset) if offset else full.logits  # row t holds the label of row t + offset
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
    opt = torch.optim.AdamW([p for p in network.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        pick = torch.randint(0, rows, (16,), generator=g)
        out = TargetOutput(logits[pick], tuple(f[pick] for f in full.features))
        loss = eagle_losses(network, {k: v[pick] for k, v in batch.items()}, out, ttt)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return network.eval()


def rule_rows(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` chat rows of the rule language: ``w80``, ``PROMPT`` random words, ``w81``, then ``NEW`` words, each
    ``RULE[parity of the word two back][the last word]`` (over the whole row, template tokens included): a next word
    the last word alone does not tell, nor the two words back alone."""
    prompts = torch.randint(0, VOCAB - 2, (PROMPT, n), generator=generator)  # the prompts' words, as make_data's
    rows = [torch.full((n,), 80), *prompts, torch.full((n,), 81)]
    for _ in range(NEW):
        rows.append(RULE[rows[-2] % 2, rows[-1]])
    return torch.stack(rows, 1)


RULE = torch.randint(0, 80, (2, VOCAB), generator=torch.Generator().manual_seed(11))
"""The rule language's two maps of the last word, chosen by the parity of the word before it."""


def rule_target() -> torch.nn.Module:
    """The tests' 4-layer Llama trained on the rule language (200 steps: every next word right on fresh rows)."""
    model = make_llama(seed=0, layers=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    answer = slice(PROMPT + 1, -1)  # logits from the closing w81 on predict the rule's words
    for _ in range(200):
        rows = rule_rows(32, g)
        logits = model(rows).logits[:, answer]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), rows[:, PROMPT + 2 :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def make_case(root: Path, model: torch.nn.Module) -> dict:
    """``model`` saved as a target with the chat template, 12 held-out chat prompts for it, the 64 chat prompts it
    continued (``make_data``), and a healthy EAGLE-3 trained on them and saved (native, recording its data as a
    fit's manifest does and the val τ_est a fit records: the teacher-forced replay on held-out greedy text)."""
    model.save_pretrained(root / "target")
    tokenizer = make_tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(root / "target")
    target = Target.from_pretrained(root / "target")
    g = torch.Generator().manual_seed(7)
    heldout = torch.randint(0, VOCAB - 2, (12, PROMPT), generator=g)
    val = torch.randint(0, VOCAB - 2, (32, PROMPT), generator=g)
    chat = [{"messages": [{"role": "user", "content": words(p)}]} for p in heldout]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in chat))
    data = make_data(root, "data", chat_template=True)
    network = train_eagle3(target, data)
    wrapped = [[80, *p, 81] for p in val.tolist()]
    val_tau = teacher_forced_tau(network, probe(target, wrapped, NEW), 4)
    case = {"root": root, "target": target, "network": network, "val_tau": val_tau, "data": data}
    saved(case, "healthy", network)
    return case


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """The random 4-layer tiny target (``make_case``)."""
    return make_case(tmp_path_factory.mktemp("doctor"), make_llama(seed=0, layers=4))


@pytest.fixture(scope="module")
def rule_case(tmp_path_factory) -> dict:
    """The target trained on the rule language (``make_case``)."""
    return make_case(tmp_path_factory.mktemp("doctor-rule"), rule_target())


def run(case: dict, drafter: Path, target: Path | None = None, **kwargs) -> dict:
    root = case["root"]
    args = {"prompts": str(root / "prompts.jsonl"), "max_new_tokens": NEW, "out": None} | kwargs
    return diagnose(drafter, resolve_target(str(target or root / "target")), **args)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def saved(case: dict, name: str, network: EagleModel, data: Path | None = None) -> Path:
    """``network`` as a native dir recording the healthy drafter's val τ_est and, as ``fit_export``'s manifest
    does, the data it was trained on (``data``, default the healthy drafter's)."""
    out = save_native(network, case["target"], case["root"] / name, {"val_tau_est": case["val_tau"]})
    write_manifest(
        out, target=case["target"].fingerprint, stage={"fit": {"data": {"train": str(data or case["data"])}}}
    )
    return out


def test_healthy_drafter_passes_every_check_and_writes_its_report(case, tmp_path, capsys):
    report = run(case, case["root"] / "healthy", out=tmp_path)
    found = checks(report)
    assert report["failed"] == [], [c["finding"] for c in report["checks"] if c["status"] != PASS]
    # on the tiny target's chat text its features add next to nothing at depth 1: no cliff to measure (INFO), else PASS
    judged = [c for c in report["checks"] if c["name"] not in ("training-time test", "engine reading")]
    assert all(c["status"] == PASS for c in judged), report["checks"]
    assert found["training-time test"]["status"] in (PASS, INFO)
    assert found["engine reading"]["status"] == NOT_RUN  # no engine reads a native dir: its export is doctored
    assert list(found) == [
        "identity",
        "feature layers",
        "norm conventions",
        "position offset",
        "training-time test",
        "chat template",
        "draft vocabulary",
        "prediction vs measurement",
        "engine reading",
    ]
    assert found["feature layers"]["data"]["best"] == list(LAYERS)
    prediction = found["prediction vs measurement"]["data"]
    assert prediction["greedy_exact"] == 12 and prediction["tau"] > 1.3  # it learned: worth doctoring
    # the teacher-forced replay is the verifier's τ on greedy text, round for round
    assert prediction["tau_teacher_forced"] == pytest.approx(prediction["tau"], abs=1e-9)
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith(("PASS", "INFO")) for line in lines) == 8
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


def test_on_the_rule_language_a_healthy_drafter_passes_the_offset_and_ttt_checks_judged(rule_case):
    """Where the checks can tell (the rule target's text), the healthy drafter passes them, judged, not INFO."""
    report = run(rule_case, rule_case["root"] / "healthy")
    found = checks(report)
    assert report["failed"] == [], [c["finding"] for c in report["checks"] if c["status"] != PASS]
    assert found["position offset"]["status"] == PASS and found["training-time test"]["status"] == PASS
    offset, ttt = found["position offset"]["data"], found["training-time test"]["data"]
    assert offset["first_token"]["0"] > 0.9 > 0.1 > max(offset["first_token"]["-1"], offset["first_token"]["1"])
    # what the target's features add at depth 1 (over features of other positions), kept by its own at depth 2
    assert ttt["teacher_forced"] - ttt["other_positions_features"] > 0.2 and ttt["retained"] > 0.8


def test_labels_shifted_by_one_fail_the_position_offset_check(rule_case):
    """A drafter trained to predict x(t+3) at the place of x(t+2) (its labels one place late)."""
    network = train_eagle3(rule_case["target"], rule_case["data"], offset=1)
    report = run(rule_case, saved(rule_case, "labels-late", network))
    found = checks(report)
    assert report["failed"] == ["position offset", "prediction vs measurement"], report["checks"]
    offset = found["position offset"]
    assert offset["data"]["peak"] == 1 and offset["data"]["first_token"]["1"] > 0.9
    assert "peak at +1" in offset["finding"] and "x(t+3) at the place of x(t+2)" in offset["cause"]
    assert found["prediction vs measurement"]["fix"] == "fix what fails above first: position offset"


def test_a_drafter_trained_without_training_time_test_fails_that_check_with_a_cliff_after_depth_1(rule_case):
    """ttt_steps 1: trained on the target's features only; from depth 2 it reads its own outputs."""
    network = train_eagle3(rule_case["target"], rule_case["data"], ttt=1)
    report = run(rule_case, saved(rule_case, "no-ttt", network))
    found = checks(report)
    assert report["failed"] == ["training-time test", "prediction vs measurement"], report["checks"]
    ttt = found["training-time test"]
    assert ttt["data"]["own_features"][0] > 0.9 and ttt["data"]["retained"] < 0.5
    assert "a cliff after depth 1" in ttt["finding"] and "no training-time test" in ttt["cause"]
    assert found["position offset"]["status"] == PASS  # its first token is right: only its later depths fail
    assert found["prediction vs measurement"]["fix"] == "fix what fails above first: training-time test"


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


@pytest.fixture(scope="module")
def raw_data(case) -> Path:
    """The same 64 chat prompts continued by the target without its chat template (generate --chat_template false:
    ``user: ...\\nassistant:``)."""
    return make_data(case["root"], "raw-data", chat_template=False)


def output_counts(data: Path) -> torch.Tensor:
    """(VOCAB,) how often the target generated each token in a generated data dir."""
    dataset, _ = load_generated(data)
    ids = torch.tensor(dataset["input_ids"], dtype=torch.long)
    return torch.bincount(ids[torch.tensor(dataset["loss_mask"]).bool()], minlength=VOCAB)


def with_draft_vocab(case: dict, counts: torch.Tensor, size: int) -> EagleModel:
    """The healthy drafter with the ``size`` tokens most frequent in ``counts`` as its draft vocabulary: its trained
    head rows for the tokens its own vocabulary held, the target's LM head rows for the rest."""
    healthy, target = case["network"], case["target"]
    network = EagleModel(dataclasses.replace(healthy.cfg, draft_vocab_size=size))
    mine = {k: v for k, v in healthy.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    network.load_state_dict(mine, strict=False)
    network.set_draft_vocab(counts.float())
    network.init_from_target(target.embed_tokens.weight, target.lm_head.weight)
    trained = dict(zip(healthy.draft_ids.tolist(), healthy.lm_head.weight, strict=True))
    with torch.no_grad():
        for row, token in enumerate(network.draft_ids.tolist()):
            if token in trained:
                network.lm_head.weight[row] = trained[token]
    return network.eval()


@pytest.mark.parametrize("size", [40, 48])
def test_a_draft_vocabulary_too_small_for_the_targets_outputs_is_named_by_its_size(case, size):
    """Counted on the target's own outputs (the healthy drafter's training data), but 40 or 48 tokens: under 90% of
    its greedy tokens. 40: even the 40 it generates most on the prompts hold under 90%. 48: those hold over 90%
    (measured on the very tokens they were counted on), yet 48 counted on the other prompts hold less of each
    prompt's than this vocabulary does: no recount helps, the size is the cause (SmolLM2's 1024 tokens on 16
    prompts of 48 tokens are this case)."""
    network = with_draft_vocab(case, output_counts(case["data"]), size)
    vocab = checks(run(case, saved(case, f"small-{size}", network)))["draft vocabulary"]
    assert vocab["status"] == FAIL and vocab["data"]["coverage"] < 0.9, vocab
    assert f"{size} tokens are too few for this target's outputs" in vocab["cause"], vocab
    assert "other text" not in vocab["cause"] and vocab["fix"].startswith("a larger draft_vocab_size")
    best, counted = vocab["data"]["best_same_size"], vocab["data"]["counted_same_size"]
    assert (best < 0.9) == (size == 40) and counted <= vocab["data"]["coverage"]


def test_a_draft_vocabulary_counted_on_other_text_than_the_targets_outputs_is_named(case, raw_data):
    """The healthy drafter's 80 tokens, counted on what the target generates outside its chat template, doctored on
    prompts in it: 80 tokens counted on the target's greedy tokens on the other prompts hold more of each prompt's
    than this vocabulary does."""
    network = with_draft_vocab(case, output_counts(raw_data), 80)
    vocab = checks(run(case, saved(case, "counted-raw", network)))["draft vocabulary"]
    assert vocab["status"] == FAIL, vocab
    assert vocab["data"]["counted_same_size"] > vocab["data"]["coverage"] + 0.05
    assert "counted on other text than the target's own outputs" in vocab["cause"] and "too few" not in vocab["cause"]
    assert vocab["fix"].startswith("build the draft vocabulary from the target's own generated data")
    assert "draft_vocab_size" not in vocab["fix"]


def test_a_peer_checkpoint_whose_d2t_the_importer_refuses_fails_draft_vocabulary_naming_the_reordered_maps(
    case, tmp_path
):
    """The healthy drafter's speculators export with its d2t permuted in the safetensors: the importer refuses it,
    and the refusal is the draft vocabulary check's finding, with that check's cause and fix (not "cannot be
    read")."""
    from safetensors.torch import load_file, save_file

    from draftsmith.export.registry import export

    peer = tmp_path / "speculators"
    export(case["root"] / "healthy", "speculators", peer, target=str(case["root"] / "target"))
    weights = peer / "model.safetensors"
    state = load_file(weights)
    ids = torch.arange(len(state["d2t"])) + state["d2t"]
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    state["d2t"] = ids[perm] - torch.arange(len(ids))
    save_file(state, weights, metadata={"format": "pt"})
    report = run(case, peer)
    vocab = checks(report)["draft vocabulary"]
    assert report["failed"] == ["draft vocabulary"] and "d2t/t2d maps are inconsistent" in vocab["finding"]
    assert "reordered d2t" in vocab["cause"] and "rebuild the maps" in vocab["fix"]


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
    # an import records no training data: the template is measured, with nothing to judge it against
    assert checks(report)["chat template"]["status"] == INFO
    assert "FAIL" not in out and "PASS    feature layers" in out and "PASS    engine reading" in out


def test_an_export_vllm_would_read_with_another_norm_flag_fails_engine_reading_not_norm_conventions(case, tmp_path):
    """The healthy drafter's speculators export without its norm_before_residual: draftsmith imports the absent
    flag as off, the weights read best so, and vLLM's speculators loader would turn it on."""
    from draftsmith.export.registry import export

    peer = tmp_path / "speculators"
    export(case["root"] / "healthy", "speculators", peer, target=str(case["root"] / "target"))
    config = json.loads((peer / "config.json").read_text())
    del config["norm_before_residual"]
    (peer / "config.json").write_text(json.dumps(config))
    report = run(case, peer)
    found = checks(report)
    assert report["failed"] == ["engine reading"], report["checks"]
    assert "norm_before_residual true (absent" in found["engine reading"]["finding"]
    assert found["norm conventions"]["status"] == PASS


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


def recorded_as(case: dict, name: str, **flags) -> Path:
    """The healthy drafter saved again with ``flags`` changed in its recorded config only (the weights untouched)."""
    out = saved(case, name, case["network"])
    info = json.loads((out / "config.json").read_text())
    info["config"] |= flags
    (out / "config.json").write_text(json.dumps(info))
    return out


@pytest.mark.parametrize("flag", ["norm_output", "fc_norm", "norm_before_residual"])
def test_a_norm_flag_flipped_in_the_record_is_named_with_the_value_the_weights_were_trained_with(case, flag):
    """norm_output (no weights: told by depth-2 acceptance), fc_norm (weights: the record asks for norms the
    weights do not hold; an engine would run them with unit weights) and norm_before_residual (speculators' residual
    norm, no weights: told by acceptance at both depths) recorded true for a drafter trained without."""
    found = checks(run(case, recorded_as(case, f"flipped-{flag}", **{flag: True})))
    norms = found["norm conventions"]
    assert norms["status"] == FAIL, norms
    assert norms["data"]["wrong"] == {flag: False} and f"set {flag}: false" in norms["fix"]
    assert f"trained with {flag} false" in norms["finding"]
    recorded = norms["data"]["acceptance"][", ".join(f"{f} {str(f == flag).lower()}" for f in NORM_FLAGS)]
    trained = norms["data"]["acceptance"][
        "fc_norm false, norm_before_fc false, norm_output false, norm_before_residual false"
    ]
    assert sum(trained) > sum(recorded)  # measured: the weights read better as trained
    if flag == "norm_before_residual":
        # no weights tell it: built as recorded, the drafter accepts next to nothing at every layer reading (no
        # false alarm there), and what it fails to accept points at the norms
        assert found["feature layers"]["status"] == INFO
        assert "norm conventions" in found["prediction vs measurement"]["fix"]
    else:
        assert found["feature layers"]["status"] == PASS  # the other checks measure the weights as trained


def test_the_norm_check_measures_every_norm_flag_an_export_writes():
    from draftsmith.export.eagle_layout import EAGLE3_NORM_FLAGS

    assert set(NORM_FLAGS) == set(EAGLE3_NORM_FLAGS)


def test_training_data_outside_the_targets_chat_template_is_named(case, raw_data):
    """A drafter trained on the same chat prompts rendered without the target's template (``raw_data``), its data
    recorded by its manifest; its draft vocabulary, counted on that data, is named as counted on other text."""
    network = train_eagle3(case["target"], raw_data)
    found = checks(run(case, saved(case, "raw-trained", network, data=raw_data)))
    template = found["chat template"]
    assert template["status"] == FAIL, template
    assert template["data"]["training_data"]["templated"] == 0 and "0 of the first 64" in template["finding"]
    assert "outside the target's chat template" in template["cause"] and "--chat_template true" in template["fix"]
    vocab = found["draft vocabulary"]
    assert "counted on other text" in vocab["cause"] and "too few" not in vocab["cause"]
    assert vocab["fix"].startswith("build the draft vocabulary from the target's own generated data"), vocab
    assert checks(run(case, case["root"] / "healthy"))["chat template"]["data"]["training_data"]["templated"] == 64


def test_the_command_exits_1_when_a_check_fails_and_0_when_none_does(case, capsys):
    args = ["--target", str(case["root"] / "target"), "--prompts", str(case["root"] / "prompts.jsonl")]
    args += ["--max_new_tokens", str(NEW), "--out", "null"]
    main(["doctor", str(case["root"] / "healthy"), *args])  # returns: exit status 0
    with pytest.raises(SystemExit) as exited:
        main(["doctor", str(recorded_as(case, "exit-fc_norm", fc_norm=True)), *args])
    assert exited.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("FAIL    norm conventions") for line in lines) == 1
