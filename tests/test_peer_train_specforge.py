"""SpecForge's own EAGLE-3 trainer on draftsmith's corpus, end to end (issue 86): the packed SmolLM2 corpus ->
``engines/peers/prepare_specforge.py`` -> ``engines/peers/specforge_train.py`` in SpecForge's venv (its offline
features, ``specforge train``, ``specforge export --to sglang``) -> ``draftsmith import`` with no edit -> greedy
speculative decoding with the imported drafter equals plain greedy decoding of SmolLM2. One row of the corpus, one
optimizer step: it checks the pipeline and the checkpoint's layout, not what the drafter learns. Skips, saying why,
where SpecForge's venv cannot be built (``engines/peer_venv.sh``).
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
from draftsmith.export.imports import import_drafter
from draftsmith.families.registry import load_network, load_trained
from draftsmith.targets import load_target, resolve, resolve_target
from engines import peer_check

pytestmark = [pytest.mark.slow, pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engines" / "peers"))
from prepare_specforge import token_rows  # noqa: E402


def test_specforge_trains_on_our_corpus_and_its_checkpoint_imports_and_decodes_exactly(tmp_path):
    python, why = peer_check.ensure_venv("specforge", ROOT / ".venv-specforge")
    if python is None:
        pytest.skip(why)
    rows = token_rows(ROOT / "benchmarks" / "data" / "smollm2-1m.tar.xz", tmp_path / "rows")
    out = tmp_path / "run"
    cmd = [str(python), str(ROOT / "engines" / "peers" / "specforge_train.py"), "--data", str(rows)]
    cmd += ["--target", str(resolve("smollm2")), "--tokens", "300", "--epochs", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    fit = json.loads((out / "fit.json").read_text())
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
