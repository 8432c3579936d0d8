"""The device follows the machine: one function (``core.machine.choose_device``) decides a fit's accelerator, devices
and precision from the machine's facts; every shipped recipe leaves them to it; on this machine (no GPU) a fit runs
as every recipe said before (cpu, 1 device, 32-true); ``--device cpu`` forces the CPU.

The GPU choices are checked on the pure function given a GPU machine's facts; the fits here are real fits of the
shipped ``eagle3`` recipe on the toy target.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_train import fit_args, setup  # noqa: F401  (the module's toy target and its generated data)

from draftsmith.cli import main
from draftsmith.core.machine import CPU_PRECISION, choose_device, local_device, resolve_trainer
from draftsmith.data.engines import EngineChoice, generation_engine
from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.choices import stage_devices
from draftsmith.train.fit import RECIPES, FitRun, configure, fit

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED = sorted(p for p in RECIPES.rglob("*.yaml") if p.parent.name != "strategy")
"""Every shipped drafter recipe (a strategy file only layers onto one)."""
CPU = {"accelerator": "cpu", "devices": 1, "precision": "32-true"}
"""What every shipped recipe said before the device decided: this machine's fit must stay exactly that."""
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")


@no_gpu
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_this_machine_without_a_gpu_fits_on_one_cpu_in_float32(device):
    chosen = local_device(device)
    assert chosen.trainer() == CPU and chosen.torch == "cpu"
    assert CPU_PRECISION == "32-true"


def test_a_gpu_machine_fits_on_every_gpu_in_bf16_mixed_where_the_gpu_has_bf16():
    h100 = choose_device(8, bf16=True, name="NVIDIA H100")
    assert h100.trainer() == {"accelerator": "gpu", "devices": 8, "precision": "bf16-mixed"}
    assert h100.torch == "cuda" and "NVIDIA H100" in h100.describe() and "× 8" in h100.describe()
    t4 = choose_device(1, bf16=False, name="Tesla T4")  # no bf16: float16 autocast, fp32 master weights
    assert t4.trainer() == {"accelerator": "gpu", "devices": 1, "precision": "16-mixed"}
    assert choose_device(0, bf16=True).trainer() == CPU  # no GPU: the CPU's choice whatever else is said


@no_gpu
def test_cuda_is_refused_in_one_line_where_there_is_no_gpu():
    for device, words in [("cuda", "no CUDA GPU"), ("tpu", "expected one of auto, cpu, cuda")]:
        with pytest.raises(DraftsmithError, match=words) as e:
            local_device(device)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: str(p.relative_to(RECIPES)))
def test_every_shipped_recipe_leaves_accelerator_devices_and_precision_to_the_device(recipe):
    trainer = yaml.safe_load(recipe.read_text())["trainer"]
    assert trainer["accelerator"] == "auto" and trainer["devices"] == "auto"
    assert "precision" in trainer and trainer["precision"] is None  # null: the device's (choose_device)


@no_gpu
@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: str(p.relative_to(RECIPES)))
def test_every_shipped_recipe_resolves_on_this_machine_to_what_it_said_before(recipe):
    resolved = configure(recipe)["trainer"]
    assert {k: resolved[k] for k in CPU} == CPU


def test_a_value_given_is_kept_and_an_explicit_cpu_is_the_cpus_choice():
    ddp_on_cpu = {"accelerator": "cpu", "devices": 2, "precision": None}  # the DDP-on-CPU test's setting
    assert resolve_trainer(ddp_on_cpu) == ddp_on_cpu | {"precision": "32-true"}
    given = {"accelerator": "gpu", "devices": -1, "precision": "bf16-mixed"}  # configs/strategy/fsdp.yaml
    assert resolve_trainer(given) == given


def toy_run(setup, out: Path, **trainer) -> FitRun:  # noqa: F811
    """Two steps of the shipped ``eagle3`` recipe on the toy target."""
    return FitRun(
        target=str(setup["target"]), train=str(setup["data-train"]), val=str(setup["data-val"]), out=out, steps=2,
        batch_size=4, model={"draft_vocab_size": 48}, trainer={"enable_progress_bar": False, **trainer},
    )  # fmt: skip


@no_gpu
def test_a_fit_and_a_cli_fit_of_a_shipped_recipe_run_on_the_device_chosen(setup, tmp_path):  # noqa: F811
    """Through ``fit()`` and through ``draftsmith fit --config``: the config the run records (what Lightning was
    given) says cpu, 1 device, 32-true, and the trainer ran so."""
    fit("eagle3", toy_run(setup, tmp_path / "fit"))
    main([*fit_args(setup, tmp_path / "cli"), "--trainer.max_steps=2", "--trainer.val_check_interval=2"])
    for root in (tmp_path / "fit", tmp_path / "cli"):
        (saved,) = Path(root).glob("**/config.yaml")
        trainer = yaml.safe_load(saved.read_text())["trainer"]
        assert {k: trainer[k] for k in CPU} == CPU, root


def test_a_fit_from_python_on_several_devices_runs_as_its_own_command(setup, tmp_path):  # noqa: F811
    """What the pipeline's fits do on a machine of several GPUs, here on two CPU processes (DDP over gloo): ``fit``
    runs the fit as its own command, whose Lightning launches the second process (in this process, Lightning would
    launch this process's command, pytest, again), and returns its checkpoints as an in-process fit does."""
    result = fit("eagle3", toy_run(setup, tmp_path / "fit", accelerator="cpu", devices=2, strategy="ddp"))
    assert result.best.is_file() and result.last.is_file() and result.score is not None
    (saved,) = (tmp_path / "fit").glob("**/config.yaml")
    assert yaml.safe_load(saved.read_text())["trainer"]["devices"] == 2


def test_the_pipeline_says_where_each_stage_runs():
    vllm = EngineChoice("vllm", Path("/venvs/vllm/bin/python"), "the user's CUDA vLLM")
    gpus = stage_devices(choose_device(2, bf16=True, name="NVIDIA H100"), vllm)
    assert "fits on cuda × 2 (NVIDIA H100) in bf16-mixed" in gpus and "DDP" in gpus
    assert "generation on cuda (vLLM (/venvs/vllm/bin/python)" in gpus
    assert "feature cache on cuda" in gpus and "verifier on cuda" in gpus
    cpu = stage_devices(choose_device(0, bf16=False, cpu="a CPU"), generation_engine("cpu"))
    assert "fits on cpu in 32-true" in cpu and "generation on cpu (batched HF generation" in cpu and "cuda" not in cpu


def test_the_pipeline_generates_with_a_cuda_vllm_only(tmp_path, monkeypatch):
    """On a GPU the data stage uses the user's own vLLM where its interpreter is found and its torch sees CUDA; a
    missing interpreter, one that cannot import vLLM, or a CPU build of vLLM leaves batched HF generation, saying
    why; a CPU pipeline generates with HF. The interpreters here are real processes (no GPU on this machine: a
    CUDA vLLM is stood in for by a python whose ``torch`` and ``vllm`` modules say so)."""
    generation_engine.cache_clear()
    monkeypatch.setenv("DRAFTSMITH_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    assert generation_engine("cpu").engine == "hf"
    missing = generation_engine("cuda")
    assert missing.engine == "hf" and "no vLLM interpreter" in missing.why
    assert generation_engine("cuda", sys.executable).engine == "hf"  # this venv: no vllm module
    assert "does not import" in generation_engine("cuda", sys.executable).why
    fake = tmp_path / "site"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "torch").mkdir()
    for flag, engine in (("False", "hf"), ("True", "vllm")):
        (fake / "torch" / "__init__.py").write_text(f"class cuda:\n    is_available = staticmethod(lambda: {flag})\n")
        python = tmp_path / f"python-{flag}"
        python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        chosen = generation_engine("cuda", str(python))
        assert chosen.engine == engine, chosen
        assert chosen.settings() == ({"engine": "vllm", "vllm_python": str(python)} if flag == "True" else {})
    assert "CPU build" in generation_engine("cuda", str(tmp_path / "python-False")).why
    generation_engine.cache_clear()


@no_gpu
def test_device_cuda_is_refused_before_any_work_and_cpu_is_accepted(tmp_path, capsys):
    """``draftsmith pipeline --device``: a value this machine cannot give is one line before a target is built or
    a prompt read; ``quickstart`` takes the same flag."""
    for command in (["pipeline", "--target", str(tmp_path / "none")], ["quickstart"]):
        with pytest.raises(SystemExit) as e:
            main([*command, "--device", "cuda", "--out", str(tmp_path / "out")])
        assert e.value.code != 0
        err = capsys.readouterr().err.strip()
        assert "--device cuda" in err and "no CUDA GPU" in err and "\n" not in err
        assert not (tmp_path / "out").exists()


def test_a_slurm_pipeline_scores_on_the_jobs_gpu_and_leaves_the_fits_precision_to_the_device(tmp_path, capsys):
    """The SLURM jobs take the same decision: the fit job names the accelerator and devices of its allocation and
    leaves the precision to ``choose_device`` on its node (the recipe's null); the score step runs on its GPU."""
    recipe = RECIPES / "eagle3.yaml"
    base = ["slurm", "pipeline", "--target", "/models/x", "--run-dir", str(tmp_path / "run"), "--config", str(recipe)]
    for gpus, device in [("1", "--device=cuda"), ("0", None)]:
        main([*base, "--time", "02:00:00", "--gpus-per-node", gpus, "--stages", "fit", "score", "--dry-run"])
        scripts = capsys.readouterr().out
        score = scripts[scripts.index("# ---- score.sbatch ----") :]
        assert (device in score) if device else "--device" not in score
        assert "--trainer.precision" not in scripts
