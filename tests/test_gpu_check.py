"""``benchmarks/gpu_check.py``, the prepared GPU run, on the CPU: its mechanics end to end (a target's config and
tokenizer prepared without weights, rebuilt with random ones, EAGLE-3 trained online and from cached features, the
verifier's decoding block twice), in an interpreter without the packages the GPU machine lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_llama, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("datasets", "jsonargparse", "wandb", "gguf", "deepspeed")
"""Packages draftsmith installs that the GPU machine's image lacks (``/work/.library/device/KINDS.md``)."""


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    """``benchmarks/gpu_check.py ARGS`` with ``ABSENT`` unimportable, as on the GPU machine."""
    hide = f"import sys, runpy; sys.modules.update(dict.fromkeys({ABSENT!r})); sys.argv = sys.argv[1:]; "
    run = "sys.path.insert(0, 'benchmarks'); runpy.run_path('benchmarks/gpu_check.py', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", hide + run, "gpu_check.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-check")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    run = gpu_check("--prepare", str(root / "prepared"), "--target", str(root / "target"))
    assert run.returncode == 0, run.stderr
    return root / "prepared"


def test_prepare_copies_the_config_and_tokenizer_without_the_weights(prepared):
    names = sorted(p.name for p in prepared.iterdir())
    assert "config.json" in names and "tokenizer.json" in names
    assert not [n for n in names if n.endswith((".safetensors", ".bin"))]


@pytest.mark.slow
def test_quick_on_the_cpu_trains_online_and_cached_and_scores_both_numerics(prepared, tmp_path):
    out = tmp_path / "out"
    run = gpu_check("--quick", "--device", "cpu", "--config", str(prepared), "--out", str(out), "--work",
                    str(tmp_path / "work"), "--tau", "2.5", "--sha", "abc1234")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["random_weights"] and result["device"] == "cpu" and result["machine"]["git"] == "abc1234"
    assert list(result["training"]) == ["2"]  # --quick trains batches of 2 sequences
    train = result["training"]["2"]
    for mode in ("online", "cached"):
        assert train[mode]["tokens_per_s"] > 0 and train[mode]["ms_per_step"] > 0
    assert train["cached_loss_gap"] < 1e-2  # cached features give the online step's loss
    assert set(result["decoding"]) == {"batch-invariant", "fast kernels"}
    for block in result["decoding"].values():
        assert block["prompts"] == 2 and block["tau"] >= 1 and block["plain_tokens_per_s"] > 0
        cost = block["verify_ratio"] + block["mean_drafted"] * block["cost_ratio"]
        assert block["projected_speedup"] == pytest.approx(2.5 / cost, abs=1e-3)
    assert result["decoding"]["batch-invariant"]["greedy_exact"] == 2  # exact numerics: greedy output is plain's
    md = (out / "gpu_check.md").read_text()
    assert "| 2 | online |" in md and "| 2 | cached |" in md and "| batch-invariant |" in md
    assert result["seconds"]["total"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu"], "--out is required (or --prepare DIR)"),
        (["--device", "cpu", "--out", "x", "--config", "nowhere"], "--config nowhere: no config.json there"),
    ],
)
def test_a_bad_argument_is_one_line(args, message):
    run = gpu_check(*args)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"gpu_check.py: error: {message}")
