"""``draftsmith doctor``'s table of what SGLang reads (``eval.doctor.engine_reads.SGLANG``) held against SGLang's own
code (sglang 0.5.23 in its own venv, ``engines/sglang_config_read.py``: its ``ModelConfig``, a constructed
``LlamaForCausalLMEagle3`` and its ``load_weights``, and the target's ``set_eagle3_layers_to_capture``; and here its
model registry, ``get_model_architecture``), so that it cannot drift silently: two EAGLE-3 drafters exported in every
layout (SGLang's, vLLM's, speculators'), the same exports with the config edits ``test_doctor_engines_vllm`` makes and
more of SGLang's own, and the checkpoint speculators' own trainer writes in the session (``conftest.speculators_fit``),
read by both. What SGLang refuses (no ``model_type``, an architecture it has no model of, a key its EAGLE-3 fails on)
the table must refuse, and every field the drafter is built from must agree; as exported (once SGLang's architecture
is named), ``load_weights`` must set every parameter of the drafter.

If the SGLang venv cannot be installed on this machine the test skips, printing why.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import eagle3_case
from test_doctor_engines_vllm import EDITS as VLLM_EDITS

from draftsmith.eval.doctor import engine_reads
from draftsmith.export.registry import export
from draftsmith.targets import resolve
from engines import vllm_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "engines" / "sglang_venv.sh"
READER = ROOT / "engines" / "sglang_config_read.py"
EDITS = {name: edit for name, (to, edit) in VLLM_EDITS.items() if to == "sglang"} | {
    "sglang-no-eagle-config-aux-ids": lambda c: c["eagle_config"].pop(engine_reads.AUX_KEY),
    "sglang-no-flags": lambda c: [c.pop(f, None) for f in engine_reads.NORMS],
    "sglang-all-flags": lambda c: c.update(dict.fromkeys(engine_reads.NORMS, True)),
    "sglang-norm-output": lambda c: c.update(norm_output=True),
    "sglang-no-target-hidden": lambda c: c.pop("target_hidden_size"),
    "sglang-other-target-hidden": lambda c: c.update(target_hidden_size=32),
    "sglang-no-draft-vocab": lambda c: c.pop("draft_vocab_size"),
    "sglang-num-aux": lambda c: c.update(num_aux_hidden_states=2),
}
"""SGLang-layout export dirs by name: the change to their config.json (None: as exported)."""
ARCH = {"architectures": ["LlamaForCausalLMEagle3"]}


def typed(config: dict) -> None:
    """A speculators config given a top-level ``model_type`` (and, to keep what SGLang builds small, the layer's
    width and depth; ``intermediate_size`` and ``vocab_size`` stay nested only) and the residual flag SGLang has not."""
    small = {k: config["transformer_layer_config"][k] for k in ("hidden_size", "num_attention_heads", "head_dim")}
    config.update(small, model_type="llama", num_hidden_layers=1, norm_before_residual=True)


OTHERS = {
    "speculators": ("speculators", None),
    "vllm": ("vllm", None),
    "speculators-arch": ("speculators", lambda c: c.update(ARCH)),
    "speculators-model-type": ("speculators", typed),
    "speculators-flat": ("speculators", lambda c: typed(c) or c.update(ARCH)),  # sglang #40630: the nested not read
    "vllm-arch": ("vllm", lambda c: c.update(ARCH)),
}
"""Export dirs in the other layouts by name: (layout, change to their config.json)."""
PEER_EDITS = {
    "as-written": None,
    "flat": lambda c: c.update(c.pop("transformer_layer_config"), **ARCH),  # target_hidden_size null: it fails
    "flat-no-target-hidden": lambda c: (
        c.update(c.pop("transformer_layer_config"), **ARCH) or c.pop("target_hidden_size")
    ),
}
DRIVER = """import json, sys
import sglang_config_read as reader
reader.install_stubs()  # SGLang imports after its stubs
reader.install_stubs = lambda: None
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.utils import get_model_architecture
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
init = LlamaForCausalLMEagle3.__init__
def filled(self, *args, **kwargs):  # torch.empty may reuse a freed drafter's equal weights: unloaded would miss
    init(self, *args, **kwargs)
    [p.data.fill_(-1234.5) for p in self.parameters()]
LlamaForCausalLMEagle3.__init__ = filled
src, dst = sys.argv[1:]
reader.main(src, dst)
spec, out = json.loads(open(src).read()), json.loads(open(dst).read())
for name, path in spec["dirs"].items():
    try:
        args = reader.server_args(spec["target"], path)
        out[name]["resolved"] = get_model_architecture(ModelConfig.from_server_args(args, model_path=path, is_draft_model=True))[1]
    except Exception as e:
        out[name]["resolved"] = f"{type(e).__name__}: {e}"
open(dst, "w").write(json.dumps(out))
"""
"""The reader (the drafter's parameters filled with one value before ``load_weights``, so that one it leaves is found
even where memory of an equal one is reused), and the class SGLang's registry resolves for each dir (``resolved``: its
name, or why none)."""
DRAFTERS = {"a": {"draft_vocab": 48}, "b": {"draft_vocab": 32, "layers": (3, 1, 2)}}
"""Two drafters (``eagle3_case`` arguments) on the same 4-layer target."""


def written(src: Path, out: Path, edit, export_to: str | None = None, target: str | None = None) -> dict:
    """``src`` exported ``export_to`` a layout at ``out`` (None: copied), its config.json changed by ``edit``."""
    if export_to is not None:
        export(src, export_to, out, target=target)
    else:
        out.mkdir(parents=True)
        for f in ("config.json", "model.safetensors"):
            (out / f).write_bytes((src / f).read_bytes())
    config = json.loads((out / "config.json").read_text())
    if edit is not None:
        edit(config)
        (out / "config.json").write_text(json.dumps(config))
    return config


def sglang_reads(python: Path, tmp: Path, target: str, dirs: dict) -> dict:
    (tmp / "in.json").write_text(json.dumps({"target": target, "dirs": dirs}))
    env = os.environ | {"PYTHONPATH": str(READER.parent)}
    proc = subprocess.run(
        [str(python), "-c", DRIVER, "in.json", "out.json"], cwd=tmp, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp / "out.json").read_text())


def disagreements(name: str, config: dict, sglang: dict, num_layers: int) -> list[str]:
    """Where the table reads ``config`` otherwise than SGLang did: what it refuses, then field by field."""
    loader = engine_reads.loaders(config)["SGLang"]
    refused = loader.refusals(config)
    table = {k: v for k, (v, _) in loader.read(config, num_layers).items()}
    by_arch = sglang["resolved"] != "LlamaForCausalLMEagle3"
    untyped = "`model_type`" in sglang["resolved"]  # refused before it looks at the architecture
    if any("architectures" in why for why in refused) != by_arch and not untyped:
        return [f"{name}: table refuses {refused}, SGLang resolves {sglang['resolved']!r}"]
    if "error" in sglang:  # SGLang refused it: the table must refuse it, or read None for the key it fails on
        failed = [k for k, v in table.items() if v is None]
        typed = any("model_type" in why for why in refused)
        if typed != ("`model_type`" in sglang["error"]) or not (typed or failed):
            return [f"{name}: table refuses {refused} and fails on {failed}, SGLang {sglang['error']}"]
        return []
    if refused:
        return [f"{name}: table refuses {refused}, SGLang reads it"] if not by_arch else []
    sglang["feature_layers"] = tuple(sglang["feature_layers"])
    return [f"{name}: {k} table {table[k]!r}, SGLang {sglang[k]!r}" for k in table if table[k] != sglang[k]]


def test_the_table_reads_every_export_as_sglang_builds_it(tmp_path):
    python, why = vllm_check.ensure_venv(ROOT / ".venv-sglang", SETUP)
    if python is None:
        print(f"SKIP SGLang config reading test: {why}")
        pytest.skip(why)
    dirs, configs, target = {}, {}, None
    layouts = {"sglang": ("sglang", None), **{k: ("sglang", e) for k, e in EDITS.items()}, **OTHERS}
    for drafter, options in DRAFTERS.items():
        case = eagle3_case(tmp_path / f"case-{drafter}", **options)
        target = target or str(case["root"] / "target")  # the same tiny target (seed 0) in each case
        for edit_name, (to, edit) in layouts.items():
            name, out = f"{drafter}:{edit_name}", tmp_path / f"{drafter}-{edit_name}"
            configs[name], dirs[name] = written(case["root"] / "native", out, edit, to, target), str(out)
    parsed = sglang_reads(python, tmp_path, target, dirs)
    disagree = []
    for name, config in configs.items():
        sglang = parsed[name]
        if name.endswith((":sglang", ":vllm-arch")):  # every parameter set from its tensors
            assert sglang["unloaded"] == [], (name, sglang["unloaded"])
        disagree += disagreements(name, config, sglang, 4)
    assert not disagree, "\n".join(disagree)


def test_the_table_reads_a_speculators_checkpoint_as_sglang_builds_it(speculators_fit, tmp_path):
    """The EAGLE-3 checkpoint speculators' own trainer writes for SmolLM2-135M (``conftest.speculators_fit``: its
    config has ``target_hidden_size`` null and ``norm_before_residual`` on), as written and flattened."""
    python, why = vllm_check.ensure_venv(ROOT / ".venv-sglang", SETUP)
    if python is None:
        pytest.skip(why)
    peer, target = Path(speculators_fit[1]["checkpoint"]), resolve("smollm2")
    configs = {name: written(peer, tmp_path / name, edit) for name, edit in PEER_EDITS.items()}
    parsed = sglang_reads(python, tmp_path, str(target), {name: str(tmp_path / name) for name in configs})
    assert parsed["flat-no-target-hidden"]["unloaded"] == [], parsed["flat-no-target-hidden"]["unloaded"]
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    disagree = [d for name, config in configs.items() for d in disagreements(name, config, parsed[name], layers)]
    assert not disagree, "\n".join(disagree)
