"""The peers' trainers on a GPU (issue 86, must-have 3): on a CUDA device each harness leaves their launcher as it is
(their kernels, their device, their wrapper) and replaces only the target's capture; on a CPU it keeps the replacements
its CPU runs were measured with, in the same command, so their stages are reused. ``benchmarks/peers_gpu.py`` refuses
a missing GPU, target or peer in one line, before any work. The whole driver on a CPU (the mechanics): its commit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def harness(name: str):
    """``engines/peers/NAME.py`` as a module (the harnesses import only the standard library at the top)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "engines" / "peers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROWS = {"target": "/t", "request": []}
DATA = {"train_rows": 3, "val_rows": 1}


def test_speculators_on_a_cpu_keeps_the_command_its_runs_were_measured_with():
    h = harness("speculators_train")
    a, _ = h.parse_args(["--out", "/o", "--lr", "2e-3", "--device", "cpu"])
    assert h.their_argv(a, ROWS, DATA, ["--x"]) == [
        "--speculator-type", "eagle3", "--verifier-name-or-path", "/t", "--data-path", "/o/data",
        "--save-path", "/o/checkpoints", "--log-dir", "/o/logs", "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager", "--num-workers", "0", "--train-data-ratio", repr(3.5 / 4), "--lr", "0.002",
        "--x",
    ]  # fmt: skip


def test_speculators_on_a_gpu_runs_their_kernels_and_loaders():
    h = harness("speculators_train")
    a, _ = h.parse_args(["--out", "/o", "--device", "cuda"])
    argv = h.their_argv(a, ROWS, DATA, [])
    assert not {"--draft-attn-impl", "--loss-implementation", "--num-workers"} & set(argv)
    assert argv[argv.index("--train-data-ratio") + 1] == repr(3.5 / 4)
    assert list(h.ON_GPU) == ["R1 hidden states"]


def test_specforge_on_a_gpu_keeps_its_attention_and_fsdp_and_on_a_cpu_replaces_them():
    h = harness("specforge_train")

    def training(device: str) -> dict:
        args = ["x", "--data", "/d", "--target", "/t", "--out", "/o", "--device", device]
        old, sys.argv = sys.argv, args
        try:
            a = h.parse()
        finally:
            sys.argv = old
        return h.base_config(a, Path("/o"))["training"]

    cpu, gpu = training("cpu"), training("cuda")
    assert (cpu["attention_backend"], cpu["fsdp_sharding"]) == ("sdpa", "NO_SHARD")
    assert "attention_backend" not in gpu and "fsdp_sharding" not in gpu
    assert {k: v for k, v in cpu.items() if k not in ("attention_backend", "fsdp_sharding")} == gpu
    assert h.ON_GPU[0].startswith("target capture") and h.ON_GPU[1].startswith("target files")


def peers_gpu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/peers_gpu.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(
            ["--device", "cuda"],
            "--device cuda: no CUDA GPU here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here"),
        ),
        (["--device", "cpu", "--target", "nowhere"], "--target nowhere: no config.json there"),
        (["--device", "cpu", "--speculators-python", sys.executable], "speculators: not importable by"),
    ],
)
def test_a_missing_gpu_target_or_peer_is_one_line(args, message, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    run = peers_gpu("--out", str(tmp_path / "out"), "--target", str(target), *args)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert message in run.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "own, cap",
    [(300.0, 120.0), (100.0, None), (None, None)],
    ids=["draftsmith-slower", "draftsmith-fastest", "no-draftsmith"],
)
def test_draftsmith_is_fitted_again_for_the_fastest_peers_seconds_only_where_its_fit_took_longer(own, cap, tmp_path):
    """τ at equal wall-clock: the equal-time fit's cap is the fastest peer's recorded seconds (speculators' whole
    training process, SpecForge's ``fit_seconds``), and there is none where draftsmith's own fit was the fastest."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers_gpu

    records = {
        "speculators.ds-recipe": {"trainer": "speculators", "train_process_seconds": 150.0, "fit_seconds": 90.0},
        "specforge.ds-recipe": {"trainer": "specforge", "fit_seconds": 120.0},
    }
    if own is not None:
        records["draftsmith"] = {"trainer": "draftsmith", "fit_seconds": own, "seconds": own + 50}
    drafters = {}
    for name, record in records.items():
        (tmp_path / name / "drafter").mkdir(parents=True)
        (tmp_path / name / "fit.json").write_text(json.dumps(record | {"tokens": 1000, "passes": 2.0}))
        drafters[name] = tmp_path / name / "drafter"
    assert peers_gpu.equal_time(drafters) == cap


def test_fits_of_other_settings_in_work_are_refused_not_reused(tmp_path):
    """A warm machine keeps ``--work``, whose finished fits a rerun reuses: a run of other settings (here another
    ``--tokens``) refuses it in one line before any stage, rather than scoring the earlier run's drafters."""
    target, work = tmp_path / "target", tmp_path / "work"
    target.mkdir()
    (target / "config.json").write_text("{}")
    work.mkdir()
    (work / "settings.json").write_text(
        json.dumps({"target": str(target.resolve()), "device": "cpu", "tokens": 250000, "epochs": 2})
    )
    args = ["--device", "cpu", "--trainers", "draftsmith", "--target", str(target), "--work", str(work)]
    run = peers_gpu(*args, "--tokens", "2000", "--out", str(tmp_path / "out"))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"peers_gpu: --work {work.resolve()} holds the fits of")
    assert sorted(p.name for p in work.iterdir()) == ["settings.json"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_peers_scoring_on_a_gpu_where_there_is_none_is_one_line(tmp_path):
    args = ["--drafter", f"theirs={tmp_path}", "--base", "theirs", "--device", "cuda", "--out", str(tmp_path / "out")]
    run = subprocess.run(
        [sys.executable, "benchmarks/peers.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "peers.py: error: --device cuda: no CUDA GPU here"
