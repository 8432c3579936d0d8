"""A peer's own trainer on draftsmith's corpus (issue 86): ``engines/peers/speculators_train.py`` runs
vllm-project/speculators' EAGLE-3 launcher (``speculators.train``) in its venv on a few rows of the packed SmolLM2
corpus, its checkpoint comes in through ``draftsmith import`` untouched, and decodes exactly (greedy speculative
output = plain greedy output).

Tiny: 400 generated tokens, 2 val rows, packed batches of 1024 tokens, a 1024-token draft vocabulary (their d2t/t2d
from the rows' token counts); the rest is their default (``norm_before_residual=True`` included: the normed feature as
the first layer's residual, which ``draftsmith import`` refused before ``Eagle3Config.norm_before_residual``). Skips,
saying why, where the peer's venv cannot be built.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from draftsmith.core.sampling import Sampling
from draftsmith.decode.verifier import SpeculativeDecoder, plain_decode
from draftsmith.export.imports import import_drafter
from draftsmith.families.registry import load_trained
from draftsmith.targets import load_target, resolve_target
from engines import peer_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[1]


def test_speculators_trains_on_our_corpus_and_its_checkpoint_imports_and_decodes_exactly(tmp_path):
    python, why = peer_check.ensure_venv("speculators", ROOT / ".venv-speculators")
    if python is None:
        pytest.skip(why)
    out = tmp_path / "run"
    cmd = [str(python), str(ROOT / "engines" / "peers" / "speculators_train.py"), "--tokens", "400"]
    cmd += ["--epochs", "1", "--val-rows", "2", "--total-seq-len", "1024", "--draft-vocab-size", "1024"]
    cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    fit = json.loads((out / "fit.json").read_text())
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
