"""``draftsmith doctor``'s table of what SGLang reads (``eval.doctor.engine_reads.SGLANG``) held against SGLang's own
code (sglang 0.5.23 in its own venv, ``engines/sglang_config_read.py``: its ``ModelConfig``, a constructed
``LlamaForCausalLMEagle3`` and the target's ``set_eagle3_layers_to_capture``), so that it cannot drift silently: two
EAGLE-3 drafters exported in SGLang's layout, and the same exports with the config edits ``test_doctor_engines_vllm``
makes to that layout and more of SGLang's own, read by both; every field the drafter is built from must agree, and
SGLang's ``load_weights`` must set every parameter of the drafter.

If the SGLang venv cannot be installed on this machine the test skips, printing why.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import eagle3_case
from test_doctor_engines_vllm import EDITS as VLLM_EDITS

from draftsmith.eval.doctor import engine_reads
from draftsmith.export.registry import export

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
}
"""SGLang-layout export dirs by name: the change to their config.json (None: as exported)."""
DRAFTERS = {"a": {"draft_vocab": 48}, "b": {"draft_vocab": 32, "layers": (3, 1, 2)}}
"""Two drafters (``eagle3_case`` arguments) on the same 4-layer target."""


def ensure_venv(venv: Path) -> tuple[Path | None, str]:
    """Build (once) the SGLang venv; (its python, "") or (None, why it failed)."""
    proc = subprocess.run(["bash", str(SETUP), str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        return None, f"{SETUP.name} failed (exit {proc.returncode}): {tail}"
    return venv / "bin" / "python", ""


def test_the_table_reads_every_sglang_export_as_sglang_builds_it(tmp_path):
    python, why = ensure_venv(ROOT / ".venv-sglang")
    if python is None:
        print(f"SKIP SGLang config reading test: {why}")
        pytest.skip(why)
    dirs, configs, target = {}, {}, None
    for drafter, options in DRAFTERS.items():
        case = eagle3_case(tmp_path / f"case-{drafter}", **options)
        target = target or str(case["root"] / "target")  # the same tiny target (seed 0) in each case
        for edit_name, edit in {"sglang": None, **EDITS}.items():
            name, out = f"{drafter}:{edit_name}", tmp_path / f"{drafter}-{edit_name}"
            export(case["root"] / "native", "sglang", out, target=target)
            config = json.loads((out / "config.json").read_text())
            if edit is not None:
                edit(config)
                (out / "config.json").write_text(json.dumps(config))
            dirs[name], configs[name] = str(out), config
    (tmp_path / "in.json").write_text(json.dumps({"target": target, "dirs": dirs}))
    proc = subprocess.run(
        [str(python), str(READER), "in.json", "out.json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads((tmp_path / "out.json").read_text())
    disagree = []
    for name, config in configs.items():
        sglang = parsed[name]
        loader = engine_reads.loaders(config, "sglang")["SGLang"]
        table = {k: v for k, (v, _) in loader.read(config, 4).items()}
        if "error" in sglang:  # SGLang refused it: the table must read None for the missing key it names
            refused = [k for k, v in table.items() if v is None and repr(k) in sglang["error"]]
            assert refused, (name, sglang["error"], table)
            continue
        assert sglang["architecture"] == "LlamaForCausalLMEagle3", (name, sglang["architecture"])
        if name.endswith(":sglang"):  # as exported: every parameter set from its tensors (an edit may add a norm)
            assert sglang["unloaded"] == [], (name, sglang["unloaded"])
        assert sglang["num_aux_hidden_states"] == len(sglang["feature_layers"]), name
        sglang["feature_layers"] = tuple(sglang["feature_layers"])
        disagree += [f"{name}: {k} table {table[k]!r}, SGLang {sglang[k]!r}" for k in table if table[k] != sglang[k]]
    assert not disagree, "\n".join(disagree)
