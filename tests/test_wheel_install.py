"""A non-editable wheel install works outside the checkout.

The wheel is built offline from a copy of the sources (so the build leaves nothing in the checkout) and
installed with ``pip install --target``; every command then runs as ``python -m draftsmith.cli`` in a fresh
directory with ``PYTHONPATH`` set to the install, which shadows the editable checkout. What is checked:
the wheel ships the package data (recipes, prompts, SLURM templates, the vLLM venv script), the SLURM
dry runs render every template from the install, and ``export`` and ``score`` run on a saved drafter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import VOCAB

from draftsmith.core.native import save_native
from draftsmith.core.target import Target
from draftsmith.families.medusa.network import MedusaConfig, MedusaModel

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = [
    "draftsmith/configs/*.yaml",
    "draftsmith/configs/smollm2/*.yaml",
    "draftsmith/configs/strategy/*.yaml",
    "draftsmith/data/prompts/*.jsonl",
    "draftsmith/pipeline/slurm/templates/*.sbatch",
    "draftsmith/export/vllm_venv.sh",
]
TIMEOUT = 600


def pip(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps --no-build-isolation --no-index`` of the checkout's sources."""
    missing = [name for name in ("pip", "setuptools") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"building the wheel offline needs {' and '.join(missing)} in {sys.prefix}")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "draftsmith", src / "draftsmith", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(root / "dist"), str(src), cwd=root)
    (built,) = (root / "dist").glob("draftsmith-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel) -> Path:
    """The wheel installed into a directory of its own."""
    site = wheel.parents[1] / "site"
    pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=wheel.parent)
    return site


def python(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd``, importing draftsmith from ``site`` (offline, one intra-op thread)."""
    env = os.environ | {"PYTHONPATH": str(site), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m draftsmith.cli ARGS`` with the installed copy."""
    return python(site, cwd, "-m", "draftsmith.cli", *args)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_ships_every_package_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for pattern in PACKAGE_DATA:
        expected = {p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern)}
        assert expected, f"the checkout has no {pattern}"
        assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"


def test_installed_copy_shadows_the_checkout(site, tmp_path):
    code = "import draftsmith, draftsmith.core.manifest as m; print(draftsmith.__file__); print(m.git_sha())"
    path, sha = ok(python(site, tmp_path, "-c", code)).splitlines()
    assert Path(path).resolve().is_relative_to(site.resolve())
    assert sha == "None"  # an installed wheel has no git checkout to describe


def test_slurm_dry_runs_render_every_template_from_the_install(site, tmp_path):
    recipe = site / "draftsmith" / "configs" / "eagle3.yaml"
    common = ["--time", "02:00:00", "--gpus-per-node", "2", "--dry-run"]
    fit = ok(run(site, tmp_path / "cwd", "slurm", "submit", "--config", str(recipe), "--run-dir", "run", *common))
    assert "#SBATCH --nodes=1\n" in fit and "#SBATCH --time=02:00:00\n" in fit
    assert f"#SBATCH --chdir={tmp_path / 'cwd'}\n" in fit
    srun = next(line for line in fit.splitlines() if line.startswith("srun "))
    assert f"-m draftsmith.cli fit --config={recipe}" in srun
    assert f"--trainer.default_root_dir={tmp_path / 'cwd' / 'run'}" in srun.split()

    args = ["slurm", "pipeline", "--target", "tiny", "--run-dir", "pipe", "--config", str(recipe), "--nodes", "2"]
    scripts = ok(run(site, tmp_path / "cwd", *args, *common))
    for name in ("generate-train", "generate-val", "fit", "score", "export"):
        assert f"# ---- {name}.sbatch ----\n#!/bin/bash\n" in scripts
    assert "#SBATCH --nodes=2\n" in scripts  # fit_multinode.sbatch
    assert not (tmp_path / "cwd" / "run").exists() and not (tmp_path / "cwd" / "pipe").exists()


@pytest.fixture
def medusa(model_dirs, tmp_path) -> Path:
    """An untrained native Medusa-1 drafter for the tiny target (the commands need no training)."""
    target = Target.from_pretrained(model_dirs["target"])
    torch.manual_seed(0)
    net = MedusaModel(MedusaConfig(num_heads=2, num_layers=1, hidden_size=target.hidden_size, vocab_size=VOCAB))
    return save_native(net, target, tmp_path / "medusa")


def test_export_and_score_run_from_the_install(site, model_dirs, medusa, tmp_path):
    work = tmp_path / "cwd"
    out = tmp_path / "vllm"
    printed = ok(run(site, work, "export", str(medusa), "--to", "vllm", "--out", str(out)))
    assert printed.startswith(f"wrote {out}\n")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2 w3 w4"}\n{"prompt": "w5 w6 w7"}\n')
    args = ["score", "--target", str(model_dirs["target"]), "--drafter", "ngram", str(medusa)]
    args += ["--prompts", str(prompts), "-k", "2", "--max-new-tokens", "8", "--out", "score"]
    ok(run(site, work, *args))
    report = json.loads((work / "score" / "report.json").read_text())
    assert [row["name"] for row in report["drafters"]] == ["ngram", str(medusa)]
    assert all(row["greedy_exact"] == 2 for row in report["drafters"])
    assert json.loads((work / "score" / "manifest.json").read_text())["git"] is None
