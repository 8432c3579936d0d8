"""SpecForge's own EAGLE-3 trainer on draftsmith's corpus, end to end (issue 86): the packed SmolLM2 corpus ->
``engines/peers/prepare_specforge.py`` -> ``engines/peers/specforge_train.py`` in SpecForge's venv (its offline
features, ``specforge train``, ``specforge export --to sglang``) -> ``draftsmith import`` with no edit -> greedy
speculative decoding with the imported drafter equals plain greedy decoding of SmolLM2. ``draftsmith doctor`` (issue
87) passes that checkpoint as SpecForge wrote it, and names the fault injected into a copy of it: a t2d one token
short of its d2t, aux layer ids written in SGLang's place and numbering only (vLLM reads them one layer low). One
row of the corpus, one optimizer step, one fit for the module: it checks the pipeline and the checkpoint's layout,
not what the drafter learns. Skips, saying why, where SpecForge's venv cannot be built (``engines/peer_venv.sh``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.core.sampling import Sampling
from draftsmith.data.shards import load_generated
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.eval.doctor import PASS
from draftsmith.export.imports import import_drafter
from draftsmith.families.eagle.layout import loader_default_layers
from draftsmith.families.registry import load_network, load_trained
from draftsmith.pipeline.doctor import diagnose
from draftsmith.targets import load_target, resolve, resolve_target
from engines import peer_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engines" / "peers"))
from prepare_specforge import token_rows  # noqa: E402

DOCTOR = {"num_prompts": 2, "max_new_tokens": 12, "k": 3}
"""A quick doctor: a one-step fit accepts next to nothing, so the measured checks say so (INFO); the static ones
(identity, draft vocabulary, engine reading) judge."""


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, dict]:
    """SpecForge's trainer run once on one row of the corpus: (its run dir, its ``fit.json``)."""
    python, why = peer_check.ensure_venv("specforge", ROOT / ".venv-specforge")
    if python is None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("specforge")
    rows = token_rows(ROOT / "benchmarks" / "data" / "smollm2-1m.tar.xz", tmp / "rows")
    out = tmp / "run"
    cmd = [str(python), str(ROOT / "engines" / "peers" / "specforge_train.py"), "--data", str(rows)]
    cmd += ["--target", str(resolve("smollm2")), "--tokens", "300", "--epochs", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "fit.json").read_text())


def test_specforge_trains_on_our_corpus_and_its_checkpoint_imports_and_decodes_exactly(fitted, tmp_path):
    out, fit = fitted
    assert (fit["rows"], fit["steps"], fit["passes"]) == (1, 1, 1.0)
    assert fit["hyperparameters"]["ttt_length"] == 7 and fit["hyperparameters"]["draft_vocab_size"] == 32000
    assert fit["tokens_per_s"] > 0 and fit["peak_rss_mib"] > 0 and len(fit["replacements"]) >= 5

    imported = import_drafter(out / "draft", "smollm2", tmp_path / "imported")
    network, info = load_network(imported)
    assert info["imported_from"]["layout"] == "sglang"
    assert network.method == "eagle3"
    target = load_target(resolve_target("smollm2"))
    decoder = SpeculativeDecoder(target, load_trained(imported, target), k=4, sampling=Sampling(0.0))
    val, _ = load_generated(ROOT / "benchmarks" / "data" / "smollm2-val.tar.xz")
    for row in val.select(range(2)):
        prompt = list(row["input_ids"][: row["prompt_len"]])
        assert decoder.generate(prompt, 16).tokens == plain_decode(target, prompt, 16, Sampling(0.0), None).tokens


def doctored(src: Path, out: Path) -> tuple[dict, dict[str, dict]]:
    """``draftsmith doctor SRC --target smollm2`` (imported on the fly): its report and its checks by name."""
    report = diagnose(src, resolve_target("smollm2"), out=out, **DOCTOR)
    return report, {c["name"]: c for c in report["checks"]}


def test_doctor_passes_the_checkpoint_as_specforge_wrote_it(fitted, tmp_path):
    report, found = doctored(fitted[0] / "draft", tmp_path)
    assert report["source"] == "imported from the sglang layout"
    assert report["failed"] == [], [c["finding"] for c in report["checks"] if c["status"] != PASS]
    for name in ("identity", "draft vocabulary", "engine reading"):
        assert found[name]["status"] == PASS, found[name]
    assert found["engine reading"]["data"]["engines"]["SGLang"]["judged"]  # SGLang's own layout: both engines judged


def t2d_one_short(state: dict) -> None:
    """t2d no longer marks the first draft token's target id (the maps disagree)."""
    state["t2d"][int(state["d2t"][0])] = False


DEFAULT = loader_default_layers(30)
"""SmolLM2's 30 layers: the hidden states every loader feeds a drafter whose config names none (SpecForge writes none)."""
FAULTS = {
    "t2d one token short": (
        {"tensors": t2d_one_short},
        "draft vocabulary",
        ["d2t/t2d maps are inconsistent", "reordered d2t"],
    ),
    "aux ids in SGLang's numbering only": (
        {"config": lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [k - 1 for k in DEFAULT]})},
        "engine reading",
        [
            f"vLLM reads a flat config: feature_layers {[k - 1 for k in DEFAULT]} (eagle_config.",
            f"not {list(DEFAULT)}",
            "SGLang reads a flat config as the drafter computes it",
            f"write eagle_aux_hidden_state_layer_ids: {list(DEFAULT)}",
        ],
    ),
}
"""Fault injected into SpecForge's own files -> the check that must fail and what its line must say."""


@pytest.mark.parametrize("fault", list(FAULTS))
def test_doctor_names_the_fault_injected_into_the_specforge_checkpoint(fitted, tmp_path, fault):
    edit, check, said = FAULTS[fault]
    src = peer_check.faulted_copy(fitted[0] / "draft", tmp_path / "faulted", **edit)
    report, found = doctored(src, tmp_path / "doctor")
    assert report["failed"] == [check], report["checks"]
    line = " ".join(found[check][k] for k in ("finding", "cause", "fix"))
    for words in said:
        assert words in line, line
