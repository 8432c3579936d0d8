"""Training core and EAGLE training: learning, checkpoints the verifier loads, DDP, exact resume, bad input."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
import yaml
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.cli import main
from draftsmith.core.sampling import Sampling
from draftsmith.core.target import Target
from draftsmith.data.generate import generate
from draftsmith.errors import DraftsmithError
from draftsmith.eval.score import score_drafters
from draftsmith.families.eagle.module import EagleModule
from draftsmith.families.registry import load_network
from draftsmith.families.specs import load_drafter
from draftsmith.layers.module import OptimConfig
from draftsmith.targets import resolve_target
from draftsmith.train.data import GeneratedDataModule, LengthBucketSampler
from draftsmith.train.fit import RECIPES, load_recipe

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def words(g: torch.Generator, n: int) -> str:
    return " ".join(f"w{i}" for i in torch.randint(0, VOCAB - 2, (n,), generator=g).tolist())


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A saved 4-layer tiny target, sampled training data and greedy validation data from it."""
    root = tmp_path_factory.mktemp("train")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n in [("train", 96), ("val", 16)]:
        lines = "".join(json.dumps({"prompt": words(g, 2 + i % 7)}) + "\n" for i in range(n))
        (root / f"{name}.jsonl").write_text(lines)
    common = {"max_new_tokens": 24, "device": "cpu", "shard_size": 64}
    generate(
        resolve_target(str(root / "target")), str(root / "train.jsonl"), root / "data-train", temperature=1.0, **common
    )
    generate(
        resolve_target(str(root / "target")), str(root / "val.jsonl"), root / "data-val", temperature=0.0, **common
    )
    other = make_llama(seed=1, layers=4)
    other.config.hidden_act = "gelu"  # same shapes, another model
    other.save_pretrained(root / "other")
    make_tokenizer().save_pretrained(root / "other")
    return {k: root / k for k in ("target", "data-train", "data-val", "other", "train.jsonl")}


def module(setup, version: int, **kwargs) -> EagleModule:
    torch.manual_seed(0)
    kwargs = {"draft_vocab_size": 48 if version == 3 else 0, "optim": OptimConfig(lr=3e-3, warmup_steps=5), **kwargs}
    return EagleModule(str(setup["target"]), version=version, **kwargs)


def datamodule(setup) -> GeneratedDataModule:
    return GeneratedDataModule(str(setup["data-train"]), str(setup["data-val"]), batch_size=8, max_length=64)


def trainer(tmp_path, steps: int, **kwargs) -> L.Trainer:
    defaults = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    return L.Trainer(max_steps=steps, default_root_dir=tmp_path, enable_model_summary=False, **defaults, **kwargs)


@pytest.mark.parametrize("version", [1, 3])
def test_training_lowers_validation_loss_and_raises_tau_estimate(setup, tmp_path, version):
    model, data = module(setup, version), datamodule(setup)
    before = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    trainer(tmp_path, 60).fit(model, data)
    after = trainer(tmp_path, 0).validate(model, data, verbose=False)[0]
    print(version, {k: (round(before[k], 3), round(after[k], 3)) for k in before})
    assert after["val/loss"] < 0.8 * before["val/loss"]
    assert after["val/tau_est"] > before["val/tau_est"] + 0.2

    # on greedy validation data the estimate replays the verifier's rounds exactly
    target = Target.from_pretrained(setup["target"])
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    scored = score_drafters(target, {"eagle": model.drafter.as_drafter()}, prompts, 4, Sampling(0.0), 24, 0)[1]
    assert scored[0].greedy_exact == len(prompts)
    assert scored[0].tau_full == pytest.approx(after["val/tau_est"], rel=1e-6)


def test_reduced_draft_vocabulary_keeps_the_most_frequent_generated_tokens(setup):
    model, data = module(setup, 3, draft_vocab_size=20), datamodule(setup)
    model.prepare_from_data(data)  # what setup("fit") runs
    counts = data.token_counts(VOCAB)
    ids = model.drafter.draft_ids
    assert len(ids) == 20 and bool((ids.diff() > 0).all())
    assert counts[ids].min() >= counts[~model.drafter.t2d].max()
    assert int(model.drafter.t2d.sum()) == 20 and bool(model.drafter.t2d[ids].all())
    # the draft LM head starts as the target's rows of the kept tokens
    assert torch.equal(model.drafter.lm_head.weight, model.target.lm_head.weight[ids])


def fit_args(setup, out: Path, config: str = "eagle3", *extra: str) -> list[str]:
    return [
        "fit",
        f"--config={ROOT / 'configs' / f'{config}.yaml'}",
        f"--model.init_args.target={setup['target']}",
        "--model.init_args.draft_vocab_size=48",
        f"--data.train={setup['data-train']}",
        f"--data.val={setup['data-val']}",
        f"--trainer.default_root_dir={out}",
        "--trainer.enable_progress_bar=false",
        "--model.init_args.optim.lr=0.003",
        "--model.init_args.optim.warmup_steps=5",
        "--trainer.max_epochs=-1",  # 12 batches an epoch: steps run across epochs
        "--trainer.check_val_every_n_epoch=null",
        *extra,
    ]


def val_metrics(version: Path) -> list[dict]:
    """The validation rows of a fit's ``metrics.csv``."""
    rows = csv.DictReader((version / "metrics.csv").read_text().splitlines())
    return [r for r in rows if r.get("val/tau_est")]


def test_fit_cli_writes_checkpoints_that_score_loads_and_decodes_exactly(setup, tmp_path, capsys):
    main(fit_args(setup, tmp_path, "eagle3", "--trainer.max_steps=40", "--trainer.val_check_interval=20",
                  "--trainer.enable_progress_bar=true"))  # fmt: skip
    out = capsys.readouterr().out  # not a terminal, as a log file: the text bar counts the steps there
    assert "Epoch 0: " in out and ("it/s" in out or "s/it" in out)
    ckpts = tmp_path / "csv" / "version_0" / "checkpoints"
    assert {p.name for p in ckpts.iterdir()} == {"best.ckpt", "last.ckpt"}
    metrics = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text()
    assert "val/tau_est" in metrics and "train/loss" in metrics and "lr-AdamW" in metrics
    assert list((tmp_path / "wandb").glob("offline-run-*")), "wandb logs offline beside the CSV"

    target = Target.from_pretrained(setup["target"])
    network, info = load_network(ckpts / "last.ckpt", target)
    assert info["method"] == "eagle3" and network.cfg.feature_layers == (1, 2, 3)  # servable default, 4 layers
    drafter = load_drafter(str(ckpts / "last.ckpt"), target)
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    scored = score_drafters(target, {"eagle3": drafter}, prompts, 4, Sampling(0.0), 24, 0)[1][0]
    assert scored.greedy_exact == len(prompts)
    # the checkpoint drafts exactly as the model that logged the last validation did
    logged = [float(r["val/tau_est"]) for r in val_metrics(tmp_path / "csv" / "version_0")]
    assert scored.tau_full == pytest.approx(logged[-1], rel=1e-5)


def test_checkpoint_is_refused_by_another_target(setup, tmp_path):
    main(fit_args(setup, tmp_path, "eagle1", "--trainer.max_steps=2", "--trainer.val_check_interval=2"))
    other = Target.from_pretrained(setup["other"])
    with pytest.raises(DraftsmithError, match="config_hash"):
        load_drafter(str(tmp_path / "csv" / "version_0" / "checkpoints" / "last.ckpt"), other)


def run_fit(setup, out: Path, *extra: str, devices: int | None = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    """``draftsmith fit`` in a subprocess; ``devices`` None: as ``extra`` (a strategy recipe) says."""
    args = fit_args(setup, out, "eagle3", "--trainer.max_steps=30", "--trainer.val_check_interval=10", *extra)
    if devices is not None:
        args += [f"--trainer.devices={devices}", "--trainer.strategy=" + ("ddp" if devices > 1 else "auto")]
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def drafter_state(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("drafter.")}


@pytest.mark.parametrize("timed", [False, True], ids=["at-validation", "timed"])
def test_resume_from_last_checkpoint_after_a_kill_equals_an_uninterrupted_run(setup, tmp_path, timed):
    """Killed mid-epoch, 5 steps after a validation's checkpoint; ``timed``: with a ``TimedLastCheckpoint`` due at
    every step too (its ``last.ckpt`` of step 14 is written after a training batch, not at a validation)."""
    reference = run_fit(setup, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]

    every_step = ["--trainer.callbacks+=draftsmith.train.cli.TimedLastCheckpoint", "--trainer.callbacks.minutes=0"]
    kill = ["--trainer.callbacks+=train_helpers.KillAtStep", "--trainer.callbacks.step=15"]
    killed = run_fit(setup, tmp_path / "killed", *(every_step if timed else []), *kill)
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL, mid-epoch, after the step-10 checkpoint
    checkpoints = tmp_path / "killed" / "csv" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]  # one last, no last-v1
    last = checkpoints / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == (14 if timed else 10)

    resumed = run_fit(setup, tmp_path / "killed", f"--ckpt_path={last}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning's warning is not true of ours
    want = drafter_state(tmp_path / "reference" / "csv" / "version_0" / "checkpoints" / "last.ckpt")
    got = drafter_state(tmp_path / "killed" / "csv" / "version_1" / "checkpoints" / "last.ckpt")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_checkpoint_callback_keeps_its_best_score_across_a_resume_into_a_new_version_dir(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from draftsmith.train.cli import ResumableModelCheckpoint

    def callback(cls, version: int) -> ModelCheckpoint:
        return cls(dirpath=tmp_path / f"version_{version}", monitor="val/tau_est", mode="max", filename="best")

    before = callback(ResumableModelCheckpoint, 0)
    best = str(tmp_path / "version_0" / "best.ckpt")
    before.best_model_score = before.kth_value = torch.tensor(1.5)
    before.best_model_path = before.kth_best_model_path = best
    before.best_k_models = {best: torch.tensor(1.5)}
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    after = callback(ResumableModelCheckpoint, 1)  # the resumed fit logs into version_1
    after.load_state_dict(before.state_dict())
    assert float(after.best_model_score) == 1.5 and after.best_model_path == best
    assert not after.check_monitor_top_k(trainer, torch.tensor(1.2))  # a worse score after the resume is not best
    assert after.check_monitor_top_k(trainer, torch.tensor(1.7))
    lightning = callback(ModelCheckpoint, 1)  # what it mends: Lightning forgets the score when the dir changes
    with pytest.warns(UserWarning, match="dirpath has changed"):
        lightning.load_state_dict(before.state_dict())
    assert lightning.best_model_score is None and lightning.check_monitor_top_k(trainer, torch.tensor(1.2))


def test_ddp_on_two_cpu_processes_trains_on_disjoint_batches(setup, tmp_path):
    record = ["--trainer.callbacks+=train_helpers.RecordBatches", f"--trainer.callbacks.out={tmp_path}"]
    result = run_fit(setup, tmp_path, "--trainer.accelerator=cpu", "--trainer.max_steps=6", *record, devices=2)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(tmp_path / "csv" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 6
    lines = [(tmp_path / f"rank{r}.jsonl").read_text().splitlines() for r in (0, 1)]
    seen = [[json.dumps(row) for line in rank for row in json.loads(line)] for rank in lines]
    assert len(seen[0]) == len(seen[1]) == 6 * 8  # each process ran 6 steps of 8 rows
    assert not set(seen[0]) & set(seen[1])  # on different rows (one epoch is 12 global batches)


def test_bucket_sampler_splits_an_epoch_between_ranks_and_resumes_mid_epoch():
    lengths = [(7 * i) % 23 + 1 for i in range(101)]
    ranks = [LengthBucketSampler(lengths, 4, seed=1, num_replicas=2, rank=r, bucket_batches=3) for r in (0, 1)]
    seen = [list(s) for s in ranks]
    assert len(seen[0]) == len(ranks[0])
    assert len(ranks[0].batches()) == len(ranks[1].batches())  # ranks step in lockstep
    assert all(len(b) == 4 for b in ranks[0].batches()[:-1] + ranks[1].batches()[:-1])  # only a last one is short
    assert set(seen[0]) | set(seen[1]) == set(range(101))
    assert len(set(seen[0]) & set(seen[1])) <= 4  # only the padding batch repeats
    single = LengthBucketSampler(lengths, 4, seed=1)
    order = list(single)
    single.resume_at = (0, 5)
    assert list(single) == order[20:]
    assert list(single) == order  # the skip applies once
    single.set_epoch(1)
    assert list(single) != order and sorted(single) == sorted(order)


def test_bad_config_key_is_an_error_naming_it(setup, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(fit_args(setup, tmp_path, "eagle3", "--model.init_args.ttt_stepz=2"))
    assert exc.value.code == 2
    assert "ttt_stepz" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field", ["optim.warmup_ratio=1.5", "optim.warmup_ratio=-0.1", "optim.warmup_steps=-3", "optim.min_lr_ratio=2"]
)
def test_an_optimizer_setting_out_of_range_is_one_line_naming_it(setup, tmp_path, capsys, field):
    """A warm-up share of 1.5 would warm up past the fit's end (the learning rate never reaching its peak)."""
    with pytest.raises(SystemExit) as exc:
        main(fit_args(setup, tmp_path, "eagle3", f"--model.init_args.{field}"))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert f"{field.split('=')[0]} " in err and err.count("\n") <= 2, err
    assert not any(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("form", ["--config", "--config="])
def test_a_missing_config_file_is_one_line_naming_it(tmp_path, capsys, form):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["fit", form, missing] if form == "--config" else ["fit", form + missing])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"draftsmith: error: fit --config {missing}: no such file\n"


@pytest.mark.parametrize(("recipe", "now"), [("peagle", "eagle.peagle"), ("dspark", "dflash.dspark")])
def test_a_config_naming_a_moved_module_is_one_line_giving_its_path_now(tmp_path, capsys, recipe, now):
    """P-EAGLE, Falcon and TLT moved into EAGLE's folder and DSpark into DFlash's: a recipe copied before, or a run's
    saved ``config.yaml``, names the former path; jsonargparse answered with its usage and "No module named"."""
    text = (RECIPES / f"{recipe}.yaml").read_text()
    assert f"draftsmith.families.{now}.module." in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace(f"families.{now}.", f"families.{recipe}."))
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(old)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"fit --config {old}: model.class_path: draftsmith.families.{recipe}.module." in err
    assert f"has moved; write draftsmith.families.{now}.module." in err
    with pytest.raises(DraftsmithError, match=f"recipe {old}: model.class_path: .* has moved; write "):
        load_recipe(old)  # the pipeline's and the Python API's door


def test_a_config_with_a_key_given_twice_is_one_line_naming_it(tmp_path, capsys):
    """A recipe pasted over another (two ``model:`` sections): PyYAML and jsonargparse kept the second silently, so
    the file trained another recipe than its name and first section said (configs/smollm2/peers/ did, 87f173a)."""
    recipe = (RECIPES / "eagle3.yaml").read_text()
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text(recipe + "model:\n  class_path: draftsmith.families.eagle.module.EagleModule\n")
    line, second = 1 + recipe.splitlines().index("model:"), 1 + len(recipe.splitlines())
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(pasted)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"fit --config {pasted}: key 'model' given twice (lines {line} and {second})" in err
    with pytest.raises(DraftsmithError, match=f"recipe {pasted}: key 'model' given twice"):
        load_recipe(pasted)


def test_data_from_another_target_is_refused_naming_both(setup, tmp_path, capsys):
    args = fit_args(setup, tmp_path, "eagle3", "--trainer.max_steps=1")
    args = [a.replace(str(setup["target"]), str(setup["other"])) for a in args]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "draftsmith: error:" in err and "Traceback" not in err
    assert str(setup["target"]) in err and str(setup["other"]) in err


def test_feature_layers_out_of_range_is_an_error(setup, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(fit_args(setup, tmp_path, "eagle3", "--model.init_args.feature_layers=[1, 2, 9]"))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "feature_layers" in err and "9" in err


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_strategy_recipes_compose_with_a_drafter_recipe(setup, tmp_path, capsys, name):
    """Each ``configs/strategy`` file layers onto a recipe; its strategy object builds (it runs on GPUs only,
    except ddp, which the DDP test runs for real on CPU)."""
    recipe = ROOT / "configs" / "strategy" / f"{name}.yaml"
    with pytest.raises(SystemExit) as exc:
        main([*fit_args(setup, tmp_path), f"--config={recipe}", "--print_config"])
    assert exc.value.code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    strategy = config["trainer"]["strategy"]
    if name == "ddp":
        assert strategy == "ddp"
        return
    if name.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    module_name, _, cls = strategy["class_path"].rpartition(".")
    built = getattr(importlib.import_module(module_name), cls)(**strategy["init_args"])
    if name.startswith("deepspeed"):
        assert built.config["zero_optimization"]["stage"] == int(name[-1])
    else:
        assert config["trainer"]["precision"] == "bf16-mixed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_gpu_strategy_fits_resumes_and_its_checkpoint_scores_exactly(setup, tmp_path, name):
    """A GPU strategy recipe on one GPU, as a user runs it: the fit learns, resumes from its last checkpoint (a
    file, or the directory DeepSpeed saves), and the verifier loads that checkpoint and drafts with it exactly, at
    about the acceptance its last validation estimated (that one under bf16 autocast, this one in float32)."""
    if name.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    strategy = (f"--config={ROOT / 'configs' / 'strategy' / f'{name}.yaml'}", "--trainer.devices=1")
    first = run_fit(setup, tmp_path, *strategy, "--trainer.max_steps=20", devices=None, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    logs = tmp_path / "csv"
    resumed = run_fit(
        setup, tmp_path, *strategy, f"--ckpt_path={logs / 'version_0' / 'checkpoints' / 'last.ckpt'}", devices=None
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    before, after = val_metrics(logs / "version_0"), val_metrics(logs / "version_1")
    assert len(before) == 2 and len(after) == 1  # steps 10 and 20, then only step 30: it went on from step 20
    assert float(after[-1]["val/loss"]) < float(before[0]["val/loss"])
    last = logs / "version_1" / "checkpoints" / "last.ckpt"
    assert last.is_dir() == name.startswith("deepspeed")
    target = Target.from_pretrained(setup["target"], device="cuda")
    drafter = load_drafter(str(last), target)
    rows = datasets.load_from_disk(str(setup["data-val"]))
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    scored = score_drafters(target, {name: drafter}, prompts, 4, Sampling(0.0), 24, 0)[1][0]
    print(name, "tau", scored.tau_full, "logged", after[-1]["val/tau_est"])
    assert scored.greedy_exact == len(prompts)
    assert scored.tau_full == pytest.approx(float(after[-1]["val/tau_est"]), abs=0.3)


def test_a_deepspeed_zero3_checkpoint_made_on_a_gpu_is_read_scored_and_exported_on_the_cpu(tmp_path):
    """``tests/data/deepspeed_stage_3``: a real ZeRO-3 checkpoint directory (``last.ckpt/``, its weights in
    DeepSpeed's shards), left by the GPU test above on an H100 (2026-11-26: EAGLE-3 on a 4-layer tiny target, 20
    steps then resumed to 30), with that target, its greedy validation data and the fit's metrics. On the CPU the
    verifier reads it (gathered from the shards), drafts exactly, at the acceptance its last validation logged;
    ``export --to native`` takes the directory too."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
    data = TESTS / "data" / "deepspeed_stage_3"
    target = Target.from_pretrained(data / "target")
    drafter = load_drafter(str(data / "last.ckpt"), target)
    prompts = [r["input_ids"][: r["prompt_len"]] for r in datasets.load_from_disk(str(data / "data-val"))]
    scored = score_drafters(target, {"zero3": drafter}, prompts, 4, Sampling(0.0), 24, 0)[1][0]
    assert scored.greedy_exact == len(prompts) == 16
    logged = val_metrics(data)[-1]
    assert scored.tau_full == pytest.approx(float(logged["val/tau_est"]), abs=0.05)  # H100 bf16: 1.751
    main(["export", str(data / "last.ckpt"), "--to", "native", "--out", str(tmp_path / "native")])
    exported, _ = load_network(tmp_path / "native", target)
    read, info = load_network(data / "last.ckpt", target)
    assert info["method"] == "eagle3"
    for name, value in read.state_dict().items():
        assert torch.equal(exported.state_dict()[name], value), name


def test_a_deepspeed_checkpoint_without_deepspeed_is_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a)
    )
    ckpt = TESTS / "data" / "deepspeed_stage_3" / "last.ckpt"
    with pytest.raises(SystemExit) as exc:
        main(["export", str(ckpt), "--to", "native", "--out", str(tmp_path / "native")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert f"{ckpt}: a DeepSpeed checkpoint; reading it needs `pip install deepspeed`" in err


def test_fit_api_takes_a_shipped_recipe_and_typed_overrides_and_records_the_run(setup, tmp_path):
    """``fit(recipe, FitRun)``: the recipe's values, the run's overrides, a manifest; the export scores exactly."""
    from draftsmith.eval.score import ScoreConfig, score_specs
    from draftsmith.families.specs import Named, NGram, Trained
    from draftsmith.train.fit import FitRun, configure, export_native, fit

    run = FitRun(
        target=str(setup["target"]),
        train=str(setup["data-train"]),
        val=str(setup["data-val"]),
        out=tmp_path / "fit",
        steps=8,
        batch_size=4,
        model={"draft_vocab_size": 48},
        trainer={"enable_progress_bar": False},
    )
    config = configure("eagle3", run)
    recipe = yaml.safe_load((ROOT / "configs" / "eagle3.yaml").read_text())
    assert config["model"]["init_args"]["ttt_steps"] == recipe["model"]["init_args"]["ttt_steps"]  # from the recipe
    assert config["model"]["init_args"]["optim"] == {
        "lr": recipe["model"]["init_args"]["optim"]["lr"],
        "warmup_steps": 1,
    }
    assert config["trainer"]["max_steps"] == 8 and config["trainer"]["val_check_interval"] == 2
    assert config["data"]["batch_size"] == 4 and config["model"]["init_args"]["draft_vocab_size"] == 48

    result = fit("eagle3", run)
    assert result.best.is_file() and result.last.is_file() and result.score is not None
    manifest = json.loads((tmp_path / "fit" / "manifest.json").read_text())
    assert manifest["target"] == Target.from_pretrained(setup["target"]).fingerprint
    assert manifest["recipe"].endswith("configs/eagle3.yaml") and manifest["versions"]["torch"] == torch.__version__
    assert manifest["seed"] is not None

    native = export_native(result, resolve_target(setup["target"]), tmp_path / "eagle3")
    assert json.loads((native / "config.json").read_text())["val_tau_est"] == result.score
    specs = [Named("ngram", NGram()), Named("eagle3", Trained(str(native)))]
    report = score_specs(
        resolve_target(setup["target"]), specs, ScoreConfig(str(setup["train.jsonl"]), num_prompts=3), tmp_path / "s"
    )
    assert [r["name"] for r in report["drafters"]] == ["ngram", "eagle3"]
    assert all(r["greedy_exact"] == 3 for r in report["drafters"])
    assert (tmp_path / "s" / "manifest.json").is_file()


def test_fit_api_resume_continues_from_the_last_checkpoint(setup, tmp_path, capsys):
    from draftsmith.train.fit import FitRun, fit, latest_checkpoint

    def run(steps: int, resume: bool):
        return fit("eagle3", FitRun(
            target=str(setup["target"]), train=str(setup["data-train"]), val=str(setup["data-val"]),
            out=tmp_path / "fit", steps=steps, batch_size=4, model={"draft_vocab_size": 48},
            trainer={"enable_progress_bar": False, "val_check_interval": 4}, resume=resume,
        ))  # fmt: skip

    run(8, resume=True)  # nothing to resume yet: a fresh run
    first = latest_checkpoint(tmp_path / "fit")
    assert torch.load(first, weights_only=False)["global_step"] == 8
    run(12, resume=True)
    assert f"resuming from {first}" in capsys.readouterr().out
    last = latest_checkpoint(tmp_path / "fit")
    assert last != first and torch.load(last, weights_only=False)["global_step"] == 12
    metrics = (last.parent.parent / "metrics.csv").read_text().splitlines()
    steps = [int(r["step"]) for r in csv.DictReader(metrics) if r.get("step")]
    assert steps and min(steps) >= 8  # the second run trained only steps 9..12
    run(4, resume=False)  # without resume the run dir starts empty
    assert torch.load(latest_checkpoint(tmp_path / "fit"), weights_only=False)["global_step"] == 4


def test_fit_api_names_an_unknown_recipe_in_one_line(tmp_path):
    from draftsmith.train.fit import recipe_path

    with pytest.raises(DraftsmithError, match="no shipped recipe of that name.*eagle3"):
        recipe_path("eagle4")


def test_training_on_cuda_turns_cudnn_attention_off_and_nowhere_else():
    """cuDNN's SDPA backward gives NaN gradients for some masked shapes on H100 / H200 since torch 2.11 (the lead, not
    confirmed, for the EAGLE-3 fit of SmolLM2 on an H200 that ended at chance); a fit on a CUDA device turns that
    kernel off, a CPU fit leaves it alone."""
    from draftsmith.core.machine import training_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        training_attention("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        training_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


class InterruptAtStep(L.Callback):
    """Ctrl-C at training step ``step`` (a KeyboardInterrupt, as Lightning receives one)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            raise KeyboardInterrupt


def test_ckpt_path_last_ckpt_as_the_docs_write_it_resumes_and_a_wrong_one_leaves_the_manifest(
    setup, tmp_path, monkeypatch, capsys
):
    """``fit ... --ckpt_path last.ckpt`` (docs/usage.md) was a traceback ("Checkpoint file not found") after the
    run's manifest.json had been rewritten with the failed command."""
    args = ["eagle1", "--trainer.val_check_interval=2"]
    main(fit_args(setup, tmp_path, *args, "--trainer.max_steps=2"))
    manifest, _ = (tmp_path / "manifest.json").read_text(), capsys.readouterr()
    monkeypatch.chdir(tmp_path / "csv")  # no last.ckpt here: the run dir's is the one meant
    with pytest.raises(SystemExit) as exit_:
        main(fit_args(setup, tmp_path, *args, "--trainer.max_steps=4", "--ckpt_path=nope.ckpt"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--ckpt_path nope.ckpt: no such file" in err
    assert (tmp_path / "manifest.json").read_text() == manifest
    main(fit_args(setup, tmp_path, *args, "--trainer.max_steps=4", "--ckpt_path", "last.ckpt"))
    assert "resuming from" in capsys.readouterr().err
    resumed = tmp_path / "csv" / "version_1" / "checkpoints" / "last.ckpt"
    assert torch.load(resumed, map_location="cpu", weights_only=False)["global_step"] == 4


def test_an_interrupted_fit_prints_the_command_that_resumes_it(setup, tmp_path, capsys):
    args = fit_args(setup, tmp_path, "eagle1", "--trainer.max_steps=8", "--trainer.val_check_interval=2")
    with pytest.raises(SystemExit):
        main([*args, "--trainer.callbacks+=test_train.InterruptAtStep", "--trainer.callbacks.step=3"])
    err = capsys.readouterr().err
    assert "resume with: draftsmith fit --config=" in err and "--ckpt_path last.ckpt" in err
    assert "InterruptAtStep" in err  # the command as it was given, less its --ckpt_path


def test_a_warmup_given_as_a_share_scales_with_the_steps_a_run_gives_and_a_fixed_one_becomes_a_tenth():
    """``optim.warmup_ratio`` (the peers' form) survives ``FitRun(steps=...)``, which replaces a fixed ``warmup_steps``
    by a tenth of the steps (the 50k peers' controls trained 3 warm-up steps, not their configs' 1%, before it)."""
    from draftsmith.layers.module import OptimConfig, warmup_steps
    from draftsmith.train.fit import FitRun, configure

    shared_config, fixed_config = (
        configure(f"smollm2/{r}", FitRun(steps=155)) for r in ("study/eagle3_31_warm1pct", "eagle3_31")
    )
    assert shared_config["trainer"]["max_steps"] == fixed_config["trainer"]["max_steps"] == 155  # the run's steps, both
    shared, fixed = (c["model"]["init_args"]["optim"] for c in (shared_config, fixed_config))
    assert shared == {"lr": 0.002, "warmup_ratio": 0.01} and fixed == {"lr": 0.002, "warmup_steps": 15}
    assert warmup_steps(OptimConfig(**shared), 155) == 2 and warmup_steps(OptimConfig(**shared), 31) == 1
    assert warmup_steps(OptimConfig(**fixed), 155) == 15


def test_a_recorded_fit_records_its_run_beside_it_and_is_not_run_again(setup, tmp_path, monkeypatch):
    """``train.recorded.recorded_fit`` (the studies' fits): the export, its record ``RUN.json`` beside the run dir
    (steps, rows, tokens, batch, epochs, seconds across sessions and those of its validations, precision, val τ_est)
    that ``fit_epochs`` reads; a fit recorded and exported is reused as recorded."""
    from draftsmith.train import recorded
    from draftsmith.train.fit import FitRun

    run = FitRun(
        target=str(setup["target"]), train=str(setup["data-train"]), val=str(setup["data-val"]),
        out=tmp_path / "fit" / "eagle3-16", steps=4, batch_size=4, data={"train_rows": 16, "max_length": 64},
        model={"draft_vocab_size": 48}, trainer={"enable_progress_bar": False, "enable_model_summary": False},
        resume=True,
    )  # fmt: skip
    export, record = recorded.recorded_fit("eagle3", run, resolve_target(setup["target"]), tmp_path / "e", 100)
    assert json.loads((tmp_path / "fit" / "eagle3-16.json").read_text()) == record
    assert (tmp_path / "fit" / "eagle3-16.partial.json").is_file() and record["sessions"] == 1
    assert {k: record[k] for k in ("steps", "rows", "tokens", "batch_size", "epochs", "precision")} == {
        "steps": 4, "rows": 16, "tokens": 100, "batch_size": 4, "epochs": 1.0, "precision": "32-true",
    }  # fmt: skip
    assert record["val_tau_est"] == json.loads((export / "config.json").read_text())["val_tau_est"] is not None
    assert record["tokens_per_s"] == pytest.approx(100 / record["seconds"], rel=0.1)  # 16 rows of 100 tokens, 1 pass
    assert recorded.fit_epochs(record) == 1.0 and recorded.fit_epochs({"steps": 10, "rows": 40}) == 2.0  # batch 8
    # the validations' seconds (sanity check and the one at the end), timed apart by the fit's own callback
    clocked = json.loads((tmp_path / "fit" / "eagle3-16" / "validation_seconds.json").read_text())["seconds"]
    assert 0 < record["validation_seconds"] == clocked < record["seconds"]
    assert record["train_tokens_per_s"] > record["tokens_per_s"]

    def refit(*args):
        raise AssertionError("a recorded fit ran again")

    monkeypatch.setattr(recorded, "fit_export", refit)
    again = recorded.recorded_fit("eagle3", run, resolve_target(setup["target"]), tmp_path / "e", 100)
    assert again == (export, record)


def test_a_stopwatch_adds_the_time_of_an_interrupted_run_to_the_next(tmp_path):
    """``core.files.Stopwatch``: a fit's wall time across sessions, saved while it runs."""
    import time

    from draftsmith.core.files import Stopwatch

    path = tmp_path / "fit.partial.json"
    with pytest.raises(KeyboardInterrupt), Stopwatch(path, every=0.05):
        time.sleep(0.2)
        assert 0.0 < json.loads(path.read_text())["seconds"] <= 0.25  # saved while it runs
        raise KeyboardInterrupt  # killed: its time so far is kept
    first = json.loads(path.read_text())["seconds"]
    with Stopwatch(path) as clock:
        time.sleep(0.1)
    assert first >= 0.2 and clock.sessions == 2 and clock.seconds >= first + 0.1
    many = tmp_path / "validations.json"  # many short blocks, each saved as it ends (ValidationClock's use)
    for _ in range(20):
        with Stopwatch(many, every=None):
            time.sleep(0.02)
    assert json.loads(many.read_text())["seconds"] >= 0.4  # none lost to rounding (0.1 s rounding kept 0.0)


def test_a_recipes_gradient_clip_reaches_the_step_and_a_clip_above_the_norm_changes_nothing(setup, tmp_path):
    """``trainer.gradient_clip_val`` clips through ``DrafterModule.configure_gradient_clipping``: a clip far below the
    gradients' norm changes the weights a few steps make; one far above it leaves them bit for bit (issue 86's clip row
    at 1.0 trained exactly as the recipe did, so its gradients never reached norm 1)."""

    def weights(clip: float | None) -> dict[str, torch.Tensor]:
        model = module(setup, 3)
        trainer(tmp_path, 3, gradient_clip_val=clip).fit(model, datamodule(setup))
        return {k: v.detach().clone() for k, v in model.drafter.state_dict().items()}

    plain, tight, loose = weights(None), weights(1e-4), weights(1e4)
    assert all(torch.equal(plain[k], loose[k]) for k in plain)
    assert not all(torch.equal(plain[k], tight[k]) for k in plain)


def test_the_validation_clock_adds_a_resumed_fits_validations_to_the_earlier_sessions(tmp_path):
    """``train.cli.ValidationClock``: a fit resumed in its run dir adds its validations' seconds to those saved there
    (a fresh fit starts from an empty dir: ``fit`` removes it)."""
    import time
    from types import SimpleNamespace

    from draftsmith.train.cli import VALIDATION_SECONDS, ValidationClock

    (tmp_path / VALIDATION_SECONDS).write_text(json.dumps({"seconds": 5.0}))  # the interrupted session's

    def trainer(fn: str) -> SimpleNamespace:
        return SimpleNamespace(default_root_dir=str(tmp_path), is_global_zero=True, state=SimpleNamespace(fn=fn))

    clock = ValidationClock()
    clock.on_validation_start(trainer("validate"), None)  # a validation outside a fit (trainer.validate)
    time.sleep(0.3)
    clock.on_validation_end(trainer("validate"), None)  # records nothing
    for _ in range(2):
        clock.on_validation_start(trainer("fit"), None)
        time.sleep(0.1)
        clock.on_validation_end(trainer("fit"), None)
    assert 5.2 <= json.loads((tmp_path / VALIDATION_SECONDS).read_text())["seconds"] < 5.6
