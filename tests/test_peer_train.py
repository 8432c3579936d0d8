"""A peer's own trainer on draftsmith's corpus (issue 86): ``engines/peers/speculators_train.py`` runs
vllm-project/speculators' EAGLE-3 launcher (``speculators.train``) in its venv on a few rows of the packed SmolLM2
corpus, its checkpoint comes in through ``draftsmith import`` untouched, and decodes exactly (greedy speculative
output = plain greedy output). ``draftsmith doctor`` (issue 87) passes that checkpoint as speculators wrote it, and
names the fault injected into a copy of it: a permuted d2t in its safetensors, a top-level ``model_type`` in its
config (vLLM then reads the speculators config flat).

Tiny: 400 generated tokens, 2 val rows, packed batches of 1024 tokens, a 16384-token draft vocabulary (their d2t/t2d
from the rows' token counts: it holds 96% of SmolLM2's greedy tokens on doctor's prompts, 8192 92%, any 1024 about
82%, which doctor rightly fails), the target's hidden states in float32 (``conftest.speculators_fit``: the fixture's
speed on a CPU without native bf16); the rest is their default (``norm_before_residual=True`` included: the normed
feature as the first layer's residual, which ``draftsmith import`` refused before
``Eagle3Config.norm_before_residual``). One fit for the session (``conftest.speculators_fit``, shared with the SGLang
reading test). Skips, saying why, where the peer's venv cannot be built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith.core.sampling import Sampling
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.eval.doctor import PASS
from draftsmith.export.imports import import_drafter
from draftsmith.families.registry import load_trained
from draftsmith.pipeline.doctor import diagnose
from draftsmith.targets import load_target, resolve_target
from engines import peer_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
DOCTOR = {"num_prompts": 2, "max_new_tokens": 12, "k": 3}
"""A quick doctor: a 400-token fit accepts next to nothing, so the measured checks say so (INFO); the static ones
(identity, draft vocabulary, engine reading) judge."""


def test_speculators_trains_on_our_corpus_and_its_checkpoint_imports_and_decodes_exactly(speculators_fit, tmp_path):
    out, fit = speculators_fit
    assert fit["tokens"] >= 400 and fit["steps"] >= 1 and fit["passes"] == 1.0, fit
    assert fit["tokens_per_s"] > 0 and fit["peak_rss_gb"] > 0
    assert set(fit["replacements"]) >= {"R1 hidden states", "R2 device", "R3 autocast", "R5 kernels"}
    assert fit["hyperparameters"]["loss_implementation"] == "eager"
    assert fit["hyperparameters"]["draft_attn_impl"] == "sdpa"

    imported = import_drafter(fit["checkpoint"], "smollm2", tmp_path / "imported")
    target = load_target(resolve_target("smollm2"))
    drafter = load_trained(imported, target)
    decoder = SpeculativeDecoder(target, drafter, k=3, sampling=Sampling(0.0))
    rows = [json.loads(line) for line in (out / "rows" / "val.jsonl").read_text().splitlines()]
    for row in rows[:2]:
        prompt = row["input_ids"][:24]
        ours = decoder.generate(prompt, 24).tokens
        assert ours == plain_decode(target, prompt, 24, Sampling(0.0), None).tokens


def doctored(src: Path, out: Path) -> tuple[dict, dict[str, dict]]:
    """``draftsmith doctor SRC --target smollm2`` (imported on the fly): its report and its checks by name."""
    report = diagnose(src, resolve_target("smollm2"), out=out, **DOCTOR)
    return report, {c["name"]: c for c in report["checks"]}


def test_doctor_passes_the_checkpoint_as_speculators_wrote_it(speculators_fit, tmp_path):
    report, found = doctored(Path(speculators_fit[1]["checkpoint"]), tmp_path)
    assert report["source"] == "imported from the speculators layout"
    assert report["failed"] == [], [c["finding"] for c in report["checks"] if c["status"] != PASS]
    for name in ("identity", "draft vocabulary", "engine reading"):
        assert found[name]["status"] == PASS, found[name]
    assert (tmp_path / "doctor.json").is_file() and (tmp_path / "doctor.md").is_file()


def permute_d2t(state: dict) -> None:
    """The same draft tokens, reordered (a conversion that shuffled the map)."""
    ids = torch.arange(len(state["d2t"])) + state["d2t"]
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))
    state["d2t"] = ids[perm] - torch.arange(len(ids))


FAULTS = {
    "permuted d2t": (
        {"tensors": permute_d2t},
        "draft vocabulary",
        ["d2t/t2d maps are inconsistent", "reordered d2t"],
    ),
    "top-level model_type": (
        {"config": lambda c: c.update(model_type="llama")},
        "engine reading",
        [
            "vLLM reads a flat config (a speculators config with a top-level model_type)",
            "hidden_size 4096 (absent from the config: the Llama default), not 576",
            "drop the top-level model_type",
        ],
    ),
}
"""Fault injected into speculators' own files -> the check that must fail and what its line must say."""


@pytest.mark.parametrize("fault", list(FAULTS))
def test_doctor_names_the_fault_injected_into_the_speculators_checkpoint(speculators_fit, tmp_path, fault):
    edit, check, said = FAULTS[fault]
    src = peer_check.faulted_copy(Path(speculators_fit[1]["checkpoint"]), tmp_path / "faulted", **edit)
    report, found = doctored(src, tmp_path / "doctor")
    assert report["failed"] == [check], report["checks"]
    line = " ".join(found[check][k] for k in ("finding", "cause", "fix"))
    for words in said:
        assert words in line, line
