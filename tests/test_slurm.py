"""``draftsmith slurm`` against a real single-node SLURM cluster started on this machine
(``scripts/slurm_cluster.sh``): DDP fit jobs, requeue on SIGUSR1 with exact resume, a chained pipeline,
bad input refused before submission. Skipped (with the reason) only where SLURM cannot be installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.pipeline.slurm.requeue import RequeueOnSignal
from draftsmith.pipeline.slurm.resources import time_seconds
from draftsmith.pipeline.slurm.sbatch import job_info
from draftsmith.targets import resolve_target

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"
RECIPE = ROOT / "configs" / "eagle3.yaml"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
STEPS = 10
GENERATE = ["max_new_tokens=24", "shard_size=16", "batch_size=16"]


# -- no cluster needed ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [("01:00:00", 3600), ("90", 5400), ("5:30", 330), ("1-02", 93600), ("2-00:30", 174600), ("0-0:0:9", 9)],
)
def test_time_limits_read_as_slurm_reads_them(value, seconds):
    assert time_seconds(value) == seconds


@pytest.mark.parametrize("value", ["1:2:3:4", "01:60:00", "1h", "", "00:00:00", "-5"])
def test_malformed_time_limit_is_an_error(value):
    with pytest.raises(DraftsmithError, match="--time"):
        time_seconds(value)


def test_rank_sharded_generation_merges_into_the_single_process_dataset(model_dirs, tmp_path):
    g = torch.Generator().manual_seed(3)
    lines = [
        " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (2 + n % 5,), generator=g).tolist()) for n in range(11)
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    common = {"max_new_tokens": 8, "shard_size": 3, "device": "cpu"}  # 4 shards: rank 0 gets 0 and 2
    generate(resolve_target(str(model_dirs["target"])), str(prompts), tmp_path / "single", **common)
    for rank in (1, 0):
        out = generate(
            resolve_target(str(model_dirs["target"])),
            str(prompts),
            tmp_path / "ranks",
            rank=rank,
            world_size=2,
            **common,
        )
        assert out == tmp_path / "ranks" / "ranks" / f"rank-{rank:05d}"
        saved = sorted(p.name for p in (out / "shards").iterdir())
        assert saved == [f"shard-{s:05d}" for s in range(4) if s % 2 == rank]
    generate(
        resolve_target(str(model_dirs["target"])), str(prompts), tmp_path / "ranks", resume=True, **common
    )  # the merge
    merged, single = (datasets.load_from_disk(str(tmp_path / d)) for d in ("ranks", "single"))
    assert merged.to_dict() == single.to_dict()
    assert not (tmp_path / "ranks" / "ranks").exists()
    meta = json.loads((tmp_path / "ranks" / "draftsmith.json").read_text())
    assert meta["status"] == "complete" and meta["rows"] == 11


def test_dry_run_prints_a_requeueing_script_and_submits_nothing(tmp_path, capsys):
    main(
        ["slurm", "submit", "--config", str(RECIPE), "--time", "02:00:00", "--gpus-per-node", "4"]
        + ["--nodes", "2", "--run-dir", str(tmp_path / "run"), "--set", "trainer.max_steps=7", "--dry-run"]
    )
    script = capsys.readouterr().out
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=02:00:00",
        "#SBATCH --signal=USR1@90",
        "#SBATCH --requeue",
    ]:
        assert line + "\n" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    for arg in [
        f"--config={RECIPE}",
        "--trainer.devices=4",
        "--trainer.num_nodes=2",
        "--trainer.accelerator=gpu",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--trainer.max_steps=7",
        "--trainer.callbacks+=draftsmith.pipeline.slurm.requeue.RequeueOnSignal",
    ]:
        assert arg in srun.split()
    assert not (tmp_path / "run").exists()


def test_time_limit_shorter_than_the_warning_signal_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["slurm", "submit", "--config", str(RECIPE), "--time", "01:00", "--dry-run"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--signal-s 90" in err and "Traceback" not in err


def test_missing_sbatch_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """With no SLURM on PATH, submitting fails before anything is written."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        main(["slurm", "submit", "--config", str(RECIPE), "--time", "01:00:00", "--run-dir", str(tmp_path / "run")])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "draftsmith: error: sbatch not found on PATH: run this on a SLURM login node "
        "(or pass --dry-run to print the script)"
    )
    assert not (tmp_path / "run").exists()


class Regression(L.LightningModule):
    """A linear model whose step ``signal_at`` sends this process SIGUSR1 between forward and backward."""

    def __init__(self, signal_at: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.signal_at = signal_at

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if self.global_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)


def test_signal_mid_step_checkpoints_after_that_step_and_stops(tmp_path, monkeypatch):
    """The handler only flags; the checkpoint is taken at the end of the step the signal interrupted."""
    slurm_env = {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "test",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    callback = RequeueOnSignal(requeue=False)
    trainer = L.Trainer(
        max_steps=10,
        default_root_dir=tmp_path,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(signal_at=3))
    assert callback.saved == tmp_path / "hpc_ckpt_1.ckpt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpc_ckpt_1.ckpt"]
    ckpt = torch.load(callback.saved, weights_only=False)
    assert ckpt["global_step"] == 4 and trainer.global_step == 4  # step 3 finished, then stopped
    assert signal.getsignal(signal.SIGUSR1) is not callback._on_signal  # restored after fit


# -- a real cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm() -> str:
    """A running single-node cluster; SLURM_CONF exported for this process and the jobs it submits."""
    installed = subprocess.run([CLUSTER, "install"], capture_output=True, text=True, timeout=600)
    if installed.returncode != 0:
        pytest.skip(f"SLURM cannot be installed here: {(installed.stderr.strip() or 'apt-get failed')[-300:]}")
    started = subprocess.run([CLUSTER, "start"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    conf = started.stdout.strip().splitlines()[-1].removeprefix("SLURM_CONF=")
    os.environ["SLURM_CONF"] = conf
    return conf


def wait(job_id: str, timeout: float = 420) -> dict[str, str]:
    """Poll until the job ends (``sbatch --wait`` is slow); a requeued job is started now, not in 2 minutes."""
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job_id)
        assert info is not None, f"job {job_id} vanished"
        if info["JobState"] in FINAL or info.get("Reason") == "DependencyNeverSatisfied":
            return info
        if info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            pytest.fail(f"job {job_id} still {info['JobState']} after {timeout} s")
        time.sleep(1)


def log(run_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(run_dir.glob("slurm-*.out")))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A saved 4-layer tiny target and prompt files."""
    root = tmp_path_factory.mktemp("slurm")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 96), ("val", 16)]:
        words = [
            " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (2 + k % 7,), generator=g).tolist()) for k in range(n)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
    return root


def fit_settings(run_dir: Path, delay: float = 0.0) -> list[str]:
    """A tiny fit: STEPS optimizer steps over epochs of 6 steps, validation every 5, steps logged."""
    return [
        "model.init_args.draft_vocab_size=48",
        f"trainer.max_steps={STEPS}",
        "trainer.max_epochs=-1",
        "trainer.val_check_interval=5",
        "trainer.check_val_every_n_epoch=null",
        "trainer.enable_progress_bar=false",
        "trainer.callbacks+=slurm_helpers.StepLog",
        f"trainer.callbacks.out={run_dir}",
        f"trainer.callbacks.delay={delay}",
    ]


@pytest.fixture(scope="module")
def pipeline_run(slurm, data, tmp_path_factory, monkeypatch_module) -> tuple[Path, dict[str, str]]:
    """generate (train + val, 2 ranks each) -> fit (2 DDP tasks) -> score -> export, as chained jobs."""
    run = tmp_path_factory.mktemp("pipeline")
    args = ["slurm", "pipeline", "--target", str(data / "target"), "--run-dir", str(run), "--config", str(RECIPE)]
    args += ["--time", "00:10:00", "--gpus-per-node", "0", "--tasks-per-node", "2", "--cpus-per-task", "1"]
    args += ["--train-prompts", str(data / "train.jsonl"), "--val-prompts", str(data / "val.jsonl")]
    args += ["--generate-set", *GENERATE, "--set", *fit_settings(run / "fit")]
    args += ["--score-set", "num_prompts=4", "max_new_tokens=16"]
    main(args)
    jobs = {j["name"]: j["job_id"] for j in json.loads((run / "jobs.json").read_text())}
    infos = {name: wait(job) for name, job in jobs.items()}
    return run, infos


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Jobs inherit the submitting environment: the test callbacks' module, single-threaded torch, no wandb."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_NUM_THREADS", "WANDB_MODE")}
    os.environ.update(PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def last_checkpoint(fit_dir: Path) -> dict:
    newest = max(fit_dir.glob("csv/version_*"), key=lambda p: int(p.name.removeprefix("version_")))
    return torch.load(newest / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def drafter_state(ckpt: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in ckpt["state_dict"].items() if k.startswith("drafter.")}


@pytest.mark.slow
def test_pipeline_jobs_run_in_dependency_order_and_all_complete(pipeline_run):
    run, infos = pipeline_run
    assert set(infos) == {"generate-train", "generate-val", "fit", "score", "export"}
    for name, info in infos.items():
        assert info["JobState"] == "COMPLETED", f"{name}: {info['JobState']}\n{log(run)[-3000:]}"
    order = [("generate-train", "fit"), ("generate-val", "fit"), ("fit", "score"), ("score", "export")]
    for before, after in order:
        assert infos[before]["EndTime"] <= infos[after]["StartTime"], (before, after)
    report = json.loads((run / "score" / "report.json").read_text())
    assert [row["name"] for row in report["drafters"]] == ["drafter"]
    assert (run / "export" / "native" / "model.safetensors").is_file()


@pytest.mark.slow
def test_training_data_is_generated_by_two_ranks_and_merged(pipeline_run):
    """The ranks split the prompts by shard and one process merged them (the merged data equals a
    single process's: test_rank_sharded_generation_merges_into_the_single_process_dataset)."""
    run, _ = pipeline_run
    assert "rank 0 of 2: shards saved" in log(run) and "rank 1 of 2: shards saved" in log(run)
    train = datasets.load_from_disk(str(run / "data" / "train"))
    assert train["prompt_index"] == list(range(96))
    assert not (run / "data" / "train" / "ranks").exists()
    meta = json.loads((run / "data" / "val" / "draftsmith.json").read_text())
    assert meta["status"] == "complete" and meta["settings"]["temperature"] == 0.0 and meta["rows"] == 16


@pytest.mark.slow
def test_fit_job_trains_on_two_ddp_tasks_and_ends_with_a_checkpoint(pipeline_run):
    run, infos = pipeline_run
    ckpt = last_checkpoint(run / "fit")
    assert ckpt["global_step"] == STEPS
    seen = steps(run / "fit")
    for rank in (0, 1):
        assert [s["step"] for s in seen if s["rank"] == rank] == list(range(STEPS))
    assert infos["fit"]["Restarts"] == "0"


@pytest.mark.slow
def test_signal_checkpoints_requeues_and_the_job_resumes_at_the_saved_step(pipeline_run, data, capsys):
    """SIGUSR1 mid-run: a checkpoint at a step boundary, a requeue, and a resumed run that trains exactly the
    remaining steps and ends with the weights of the uninterrupted pipeline fit."""
    pipeline, _ = pipeline_run
    run = pipeline.parent / (pipeline.name + "-requeue")
    sources = [
        f"model.init_args.target={data / 'target'}",
        f"data.train={pipeline / 'data' / 'train'}",
        f"data.val={pipeline / 'data' / 'val'}",
    ]
    main(
        [
            "slurm",
            "submit",
            "--config",
            str(RECIPE),
            "--time",
            "00:10:00",
            "--gpus-per-node",
            "0",
            "--tasks-per-node",
            "2",
            "--cpus-per-task",
            "1",
            "--run-dir",
            str(run),
            "--set",
            *sources,
            *fit_settings(run, delay=0.5),
        ]
    )
    job = capsys.readouterr().out.strip()
    deadline = time.monotonic() + 300
    while not (run / "steps.jsonl").is_file() or len(steps(run)) < 6:  # 3 steps on each rank
        assert time.monotonic() < deadline and job_info(job)["JobState"] in ("PENDING", "RUNNING"), log(run)
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    info = wait(job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log(run)[-3000:]

    saved = torch.load(run / "hpc_ckpt_1.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 3 <= saved < STEPS
    seen = steps(run)
    for rank in (0, 1):
        assert [s["step"] for s in seen if s["rank"] == rank and s["restart"] == 0] == list(range(saved))
        assert [s["step"] for s in seen if s["rank"] == rank and s["restart"] == 1] == list(range(saved, STEPS))
    resumed, reference = last_checkpoint(run), last_checkpoint(pipeline / "fit")
    assert resumed["global_step"] == STEPS
    want, got = drafter_state(reference), drafter_state(resumed)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name

    main(["slurm", "status", str(run)])
    out = capsys.readouterr().out
    assert "COMPLETED" in out and "hpc_ckpt_1.ckpt" in out and "train/loss" in out


@pytest.mark.slow
def test_unknown_partition_is_refused_before_submission(slurm, tmp_path, capsys):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "slurm",
                "submit",
                "--config",
                str(RECIPE),
                "--time",
                "01:00:00",
                "--partition",
                "nope",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert (
        err.strip() == "draftsmith: error: --partition 'nope' is not a partition of this cluster (sinfo lists: debug)"
    )
    assert not (tmp_path / "run").exists()
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    assert before == after


def test_vllm_generation_runs_one_task_per_tensor_parallel_group(tmp_path, capsys):
    base = ["slurm", "pipeline", "--target", "/models/x", "--run-dir", str(tmp_path / "run"), "--config", str(RECIPE)]
    base += ["--time", "02:00:00", "--gpus-per-node", "8", "--stages", "generate", "--dry-run"]
    main([*base, "--generate-set", "engine=vllm", "tensor_parallel_size=2", "vllm_python=/venvs/vllm/bin/python"])
    script = capsys.readouterr().out.split("# ---- generate-val.sbatch ----")[0]
    assert "#SBATCH --ntasks-per-node=4\n" in script
    task = script[script.index("bash -c") :]
    # each task's vLLM sees GPUs 2r and 2r + 1 of its node
    assert "export CUDA_VISIBLE_DEVICES=$(seq -s, $((SLURM_LOCALID * 2)) $((SLURM_LOCALID * 2 + 1)));" in task
    assert "--engine=vllm" in task and "--tensor_parallel_size=2" in task and '--device="auto"' in task
    with pytest.raises(SystemExit):
        main([*base, "--generate-set", "engine=vllm", "tensor_parallel_size=3"])
    assert "tensor_parallel_size=3: must divide --gpus-per-node 8" in capsys.readouterr().err
    main([*base, "--generate-set", "max_new_tokens=8"])  # the HF engine: one task per GPU, as before
    script = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=8\n" in script and "export CUDA_VISIBLE_DEVICES" not in script
