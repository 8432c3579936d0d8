"""``draftsmith doctor``'s engine reading check: an EAGLE-3 exported in each layout is read by vLLM's (and, in its own
layout, SGLang's) loader as the drafter computes it; a config an engine would read otherwise fails on the field it
misreads (a norm flag left to a loader's default, aux ids nested where vLLM reads them in its own numbering, a
speculators config vLLM reads flat). The table itself is held against vLLM's real parsing in
``test_doctor_engines_vllm.py``; here against ``export.eagle_layout``'s facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import eagle3_case

from draftsmith.core import native
from draftsmith.eval.doctor import FAIL, NORM_FLAGS, NOT_RUN, PASS, check_engines, engine_reads
from draftsmith.export import eagle_layout
from draftsmith.export.imports import import_drafter
from draftsmith.export.registry import export
from draftsmith.families.registry import build

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """A 4-layer tiny target and an EAGLE-3 for it reading hidden states (1, 2, 3), 48 draft tokens."""
    return eagle3_case(tmp_path_factory.mktemp("engines"), draft_vocab=48)


def exported(case: dict, to: str, out: Path, edit=None) -> Path:
    """The drafter exported ``--to`` a layout, its ``config.json`` changed by ``edit`` (a function of the dict)."""
    export(case["root"] / "native", to, out, target=str(case["root"] / "target"))
    if edit is not None:
        config = json.loads((out / "config.json").read_text())
        edit(config)
        (out / "config.json").write_text(json.dumps(config))
    return out


def doctored(case: dict, src: Path, tmp: Path):
    """The engine reading check of a checkpoint, imported as ``draftsmith doctor`` imports it."""
    info, state = native.read(import_drafter(src, str(case["root"] / "target"), tmp / "imported"))
    return check_engines(build(info, state, str(src)), info, 4)


@pytest.mark.parametrize("to", ["speculators", "vllm", "sglang"])
def test_an_export_in_each_layout_is_read_by_the_engines_as_the_drafter_computes_it(case, tmp_path, to):
    check = doctored(case, exported(case, to, tmp_path / to), tmp_path)
    assert check.status == PASS, check.line()  # SGLang refuses the other layouts: named, not failed
    engines = check.data["engines"]
    assert engines["vLLM"]["judged"] and engines["vLLM"]["misread"] == []
    assert engines["vLLM"]["reads"] == ("a speculators config" if to == "speculators" else "a flat config")
    refuses = {"sglang": [], "vllm": ["architectures[0] Eagle3LlamaForCausalLM, not its LlamaForCausalLMEagle3"]}
    assert engines["SGLang"]["refuses"][:1] == refuses.get(
        to, ["no top-level model_type, which transformers' AutoConfig needs"]
    )


def test_a_speculators_config_without_norm_before_residual_is_read_by_vllm_with_it_on(case, tmp_path):
    """draftsmith imports the absent flag as off; vLLM's speculators loader defaults it to on."""
    src = exported(case, "speculators", tmp_path / "speculators", lambda c: c.pop("norm_before_residual"))
    check = doctored(case, src, tmp_path)
    assert check.status == FAIL, check.line()
    [wrong] = check.data["engines"]["vLLM"]["misread"]
    assert wrong["field"] == "norm_before_residual" and wrong["reads"] is True and wrong["trained"] is False
    assert "absent" in wrong["from"] and "norm_before_residual true" in check.finding
    assert "norm_before_residual: false" in check.fix


def test_sglang_aux_ids_under_eagle_config_only_are_read_one_layer_low_by_vllm(case, tmp_path):
    """SpecForge writes the ids under ``eagle_config`` in SGLang's numbering only; vLLM reads them there as its
    own."""
    src = exported(case, "sglang", tmp_path / "sglang", lambda c: c.pop(engine_reads.AUX_KEY))
    check = doctored(case, src, tmp_path)
    assert check.status == FAIL, check.line()
    [wrong] = check.data["engines"]["vLLM"]["misread"]
    assert wrong["field"] == "feature_layers" and wrong["reads"] == (0, 1, 2) and wrong["trained"] == (1, 2, 3)
    assert "eagle_config" in wrong["from"]
    assert check.data["engines"]["SGLang"]["misread"] == []  # SGLang reads them in its numbering


def test_a_speculators_config_with_a_model_type_is_read_flat_by_vllm(case, tmp_path):
    """A top-level ``model_type`` makes vLLM read the config flat: the layer's shape nested in
    ``transformer_layer_config`` is not read (sglang #40630's misread, the other way round)."""
    src = exported(case, "speculators", tmp_path / "speculators", lambda c: c.update(model_type="llama"))
    check = doctored(case, src, tmp_path)
    assert check.status == FAIL, check.line()
    fields = {w["field"] for w in check.data["engines"]["vLLM"]["misread"]}
    assert {"hidden_size", "intermediate_size", "num_attention_heads"} <= fields
    assert "top-level model_type" in check.data["engines"]["vLLM"]["reads"] and "drop" in check.fix


def test_a_native_drafter_is_not_judged_and_says_to_doctor_its_export(case):
    info, state = native.read(case["root"] / "native")
    check = check_engines(build(info, state, "native"), info, 4)
    assert check.status == NOT_RUN and "draftsmith export" in check.finding


def test_a_drafter_imported_from_a_checkpoint_now_gone_is_not_judged(case, tmp_path):
    """A native dir ``draftsmith import`` wrote records where it came from; doctored after that dir was removed."""
    src = exported(case, "speculators", tmp_path / "speculators")
    info, state = native.read(import_drafter(src, str(case["root"] / "target"), tmp_path / "imported"))
    (src / "config.json").unlink()
    check = check_engines(build(info, state, "imported"), info, 4)
    assert check.status == NOT_RUN and "is gone" in check.finding


def test_the_table_agrees_with_the_export_layouts():
    assert engine_reads.VLLM_FLAT.aux_ids[0] == (eagle_layout.VLLM_IDS.keys, eagle_layout.VLLM_IDS.offset)
    assert engine_reads.SGLANG.aux_ids == ((eagle_layout.SGLANG_IDS.keys, eagle_layout.SGLANG_IDS.offset),)
    assert engine_reads.VLLM_SPECULATORS.layer_config == eagle_layout.LAYOUTS["speculators"].layer_config
    assert set(engine_reads.NORMS) == set(eagle_layout.EAGLE3_NORM_FLAGS) == set(NORM_FLAGS)


def test_the_engines_count_the_aux_states_their_fc_takes_from_the_count_or_the_nested_ids(case, tmp_path):
    """Both engines' ``fc`` concatenates ``num_aux_hidden_states`` aux states, else as many as the ids under
    ``eagle_config``, else 3 (the top-level ids are not counted; ``engine_reads``' docstring has the sources)."""
    src = exported(case, "sglang", tmp_path / "count", lambda c: c.update(num_aux_hidden_states=2))
    check = doctored(case, src, tmp_path / "a")
    assert check.status == FAIL, check.line()
    for engine in ("vLLM", "SGLang"):
        [wrong] = check.data["engines"][engine]["misread"]
        assert (wrong["field"], wrong["reads"], wrong["trained"]) == ("num_aux_hidden_states", 2, 3)
        assert f"{engine}: write num_aux_hidden_states: 3 in config.json" in check.fix
    # a drafter over two feature layers: counted from the two ids under eagle_config, else read as three
    two = eagle3_case(tmp_path / "two", draft_vocab=48, layers=(1, 3))
    config = json.loads((src / "config.json").read_text())
    config.pop("num_aux_hidden_states")
    config[engine_reads.AUX_KEY], config["eagle_config"][engine_reads.AUX_KEY] = [1, 3], [0, 2]
    for name, edit in {"nested": None, "top-level only": lambda c: c["eagle_config"].pop(engine_reads.AUX_KEY)}.items():
        written = dict(config, eagle_config=dict(config["eagle_config"]))
        if edit:
            edit(written)
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(written))
        check = check_engines(two["network"], {"imported_from": {"path": str(tmp_path / name), "layout": "sglang"}}, 4)
        misread = {e: [(w["field"], w["reads"]) for w in v["misread"]] for e, v in check.data["engines"].items()}
        if edit is None:
            assert check.status == PASS, check.line()
        else:  # vLLM reads the top-level ids but counts three; SGLang reads its default layers too
            assert ("num_aux_hidden_states", 3) in misread["vLLM"] and ("num_aux_hidden_states", 3) in misread["SGLang"]
            assert "vLLM: write num_aux_hidden_states: 2 in config.json" in check.fix
