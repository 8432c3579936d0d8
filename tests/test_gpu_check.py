"""``benchmarks/gpu_check.py``, the prepared GPU run, on the CPU: its mechanics end to end (a target's config and
tokenizer prepared without weights, rebuilt with random ones, EAGLE-3 trained online and from cached features, the
verifier's decoding block twice), in an interpreter without the packages the GPU machine lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import VOCAB, make_llama, make_tokenizer

from draftsmith.targets import resolve_target

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


@pytest.fixture(scope="module")
def packed_corpus(tmp_path_factory) -> Path:
    """A 4-layer target, its sampled answers packed (train) and its greedy ones (val), and an EAGLE-3 recipe for it."""
    from draftsmith.data.generate import generate
    from draftsmith.data.packed import pack

    root = tmp_path_factory.mktemp("gpu-fit")
    make_llama(seed=0, layers=4).save_pretrained(root / "target")
    make_tokenizer().save_pretrained(root / "target")
    g = torch.Generator().manual_seed(0)
    for name, n, temperature in [("train", 24, 1.0), ("val", 4, 0.0)]:
        words = (" ".join(f"w{i}" for i in torch.randint(0, 90, (2 + j % 5,), generator=g).tolist()) for j in range(n))
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in words))
        generate(resolve_target(str(root / "target")), str(root / f"{name}.jsonl"), root / name, temperature=temperature,
                 max_new_tokens=16, device="cpu", shard_size=8)  # fmt: skip
        pack(root / name, root / f"{name}.tar.xz")
    recipe = yaml.safe_load((ROOT / "configs" / "smollm2" / "eagle3.yaml").read_text())
    recipe["model"]["init_args"] |= {"feature_layers": [1, 2, 3], "draft_vocab_size": 48}
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return root


def test_packed_data_batches_the_rows_as_the_generated_data_module_does(packed_corpus):
    """The fit on the GPU reads the packed file without ``datasets``; its batches must be the recipe's fits'."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_fit import PackedData

    from draftsmith.data.packed import read_columns, unpack
    from draftsmith.train.data import GeneratedDataModule

    _, columns = read_columns(packed_corpus / "train.tar.xz")
    _, val = read_columns(packed_corpus / "val.tar.xz")
    rows = 20
    train = {k: columns[k][:rows] for k in ("input_ids", "loss_mask")}
    ours = PackedData(train, val, batch_size=4, max_length=12)
    theirs = GeneratedDataModule(train=str(unpack(packed_corpus / "train.tar.xz", packed_corpus / "unpacked")),
                                 val=str(packed_corpus / "val"), batch_size=4, max_length=12, train_rows=rows)  # fmt: skip
    theirs.setup()
    for a, b in zip(ours.train_dataloader(), theirs.train_dataloader(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for a, b in zip(ours.val_dataloader(), theirs.val_dataloader(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(ours.token_counts(VOCAB), theirs.token_counts(VOCAB))


@pytest.mark.slow
def test_fit_on_a_packed_corpus_then_decode_with_its_drafter(packed_corpus, tmp_path):
    out = tmp_path / "out"
    run = gpu_check("--device", "cpu", "--target", str(packed_corpus / "target"), "--no-throughput", "--corpus",
                    str(packed_corpus / "train.tar.xz"), "--val-corpus", str(packed_corpus / "val.tar.xz"),
                    "--recipe", str(packed_corpus / "recipe.yaml"), "--tokens", "100", "--epochs", "2",
                    "--fit-batch", "4", "--prompts", "2", "--new-tokens", "8", "--numerics", "invariant",
                    "--out", str(out), "--work", str(tmp_path / "work"))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    fit = result["fit"]
    assert fit["generated_tokens"] >= 100 and fit["steps"] == fit["steps_done"] == -(-2 * fit["rows"] // 4)
    assert 1.0 <= fit["val_tau_est"] <= 5.0 and result["training"] == {}
    assert fit["row_tokens"] < fit["tokens_trained"] <= 2 * fit["row_tokens"] and fit["tokens_per_s"] > 0
    assert fit["corpus_target"]["tokenizer_hash"] == fit["target_fingerprint"]["tokenizer_hash"]
    assert fit["first_nonfinite_step"] is None
    assert list(result["decoding"]) == ["batch-invariant"]
    assert result["decoding"]["batch-invariant"]["greedy_exact"] == 2  # the fitted drafter decodes exactly
    assert (tmp_path / "work" / "fitted" / "config.json").is_file()
    assert "Fit: `" in (out / "gpu_check.md").read_text()


@pytest.mark.slow
def test_the_packed_fit_trains_step_for_step_as_the_recipes_fit(packed_corpus, tmp_path):
    """The same recipe, rows, batches, steps and seed: gpu_check's fit (numpy-read rows, a plain Trainer) and
    ``draftsmith fit`` (LightningCLI, GeneratedDataModule over the unpacked corpus) log the same training losses."""
    import csv

    from draftsmith.data.packed import unpack
    from draftsmith.train.fit import FitRun, fit

    target = packed_corpus / "target"
    run = gpu_check("--device", "cpu", "--dtype", "float32", "--precision", "32-true", "--target", str(target),
                    "--no-throughput", "--corpus", str(packed_corpus / "train.tar.xz"), "--val-corpus",
                    str(packed_corpus / "val.tar.xz"), "--recipe", str(packed_corpus / "recipe.yaml"), "--tokens", "100",
                    "--epochs", "2", "--fit-batch", "4", "--log-every", "1", "--prompts", "1", "--new-tokens", "4",
                    "--numerics", "invariant", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    ours = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["fit"]
    log = tmp_path / "work" / "fit-log" / "metrics.csv"
    with open(log) as f:
        our_losses = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}
    unpacked = unpack(packed_corpus / "train.tar.xz", tmp_path / "unpacked")
    fit(str(packed_corpus / "recipe.yaml"), FitRun(
        target=f"{target}:float32", train=str(unpacked), val=str(packed_corpus / "val"), out=tmp_path / "fit",
        steps=ours["steps"], batch_size=4, data={"train_rows": ours["rows"], "max_length": 640},
        trainer={"precision": "32-true", "log_every_n_steps": 1, "enable_model_summary": False},
    ))  # fmt: skip
    with open(next((tmp_path / "fit").glob("csv/version_*/metrics.csv"))) as f:
        their_losses = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}
    assert len(our_losses) >= ours["steps"] - 1 and our_losses.keys() == their_losses.keys()
    for step, loss in our_losses.items():
        assert loss == pytest.approx(their_losses[step], rel=1e-4), step


def test_a_loss_that_is_not_finite_stops_the_fit_at_the_next_check():
    """The GPU fit that did not learn recorded no loss; the counter now stops a fit whose loss is NaN or inf."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_fit import TokenCounter

    counter = TokenCounter(every=10)
    batch = {"attention_mask": torch.ones(2, 3)}
    for step, loss in [(9, float("nan")), (10, 2.0), (19, 1.5), (20, float("inf"))]:
        trainer = SimpleNamespace(global_step=step, should_stop=False)
        counter.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, batch, step)
        assert trainer.should_stop == (step == 20)  # step 9's NaN falls between checks; step 20's inf is caught
    assert counter.nonfinite_step == 20 and counter.tokens == 24


def test_a_data_budget_is_the_shortest_prefix_of_rows_holding_that_many_generated_tokens():
    """``train.data.generated_prefix``: the one rule of scaling.py's sizes and gpu_check's --tokens (numpy or list
    columns alike)."""
    import numpy as np

    from draftsmith.train.data import generated_prefix

    masks = [[0, 1, 1], np.array([0, 0, 1], dtype=np.int8), [1, 1, 1, 1]]  # 2, 1, 4 generated tokens
    assert generated_prefix(masks, 2) == (1, 2)
    assert generated_prefix(masks, 3) == (2, 3)
    assert generated_prefix(masks, 4) == (3, 7)
    assert generated_prefix(masks, 100) == (3, 7)  # fewer than asked: all of them
    assert generated_prefix([], 5) == (0, 0)


def test_smollm2s_weights_travel_in_two_parts_under_the_calls_limit_and_convert_there_to_the_same_bits(tmp_path):
    """``benchmarks/gpu_weights.sh``: split here, then the device's two calls (A keeps part A and the gguf package,
    B joins the parts and converts), run on this machine: the target dir it writes holds the float32 target's own
    weights, bit for bit, with this machine's config and tokenizer."""
    import os

    from draftsmith.core.manifest import file_sha256
    from draftsmith.targets import resolve

    env = os.environ | {"GPU": str(tmp_path / "gpu"), "WHL": str(tmp_path / "whl"), "KEEP": str(tmp_path / "keep"),
                        "PYTHON": sys.executable}  # fmt: skip
    out = tmp_path / "smol"
    for step in (["split"], ["a"], ["b", str(out)]):
        run = subprocess.run(["bash", "benchmarks/gpu_weights.sh", *step], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
    assert all((tmp_path / "gpu" / p).stat().st_size < 64 * 2**20 for p in ("part-a", "part-b"))
    target = resolve("smollm2")
    assert file_sha256(out / "model.safetensors") == file_sha256(target / "model.safetensors")
    assert (
        json.loads((out / "config.json").read_text())["eos_token_id"]
        == json.loads((target / "config.json").read_text())["eos_token_id"]
    )


@pytest.mark.slow
def test_the_device_check_runs_every_stage_on_the_cpu_with_smoke_settings(packed_corpus, tmp_path):
    """``gpu_check.py --check --smoke``: the prepared device check's mechanics (env, kernels, the rate fits online and
    from cached features, the timed fit with its validations and losses), one table, the results named by device."""
    out = tmp_path / "out"
    run = gpu_check("--check", "--smoke", "--device", "cpu", "--target", str(packed_corpus / "target"), "--corpus",
                    str(packed_corpus / "train.tar.xz"), "--val-corpus", str(packed_corpus / "val.tar.xz"),
                    "--recipe", str(packed_corpus / "recipe.yaml"), "--out", str(out), "--work",
                    str(tmp_path / "work"), "--sha", "abc1234")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "gpu_fit_cpu_smoke.json").read_text())
    assert result["device"] == "cpu" and result["smoke"] and result["machine"]["git"] == "abc1234"
    assert result["env"]["final_state_logits"] is True
    assert len(result["kernels"]) == 2 and all(
        b["target_finite"] and b["math"]["grads_finite"] for b in result["kernels"]
    )
    assert set(result["rate"]) == {"online, cuDNN off", "cached, cuDNN off"}  # no cuDNN on a CPU
    for rate in result["rate"].values():
        assert rate["nonfinite"] is None and rate["steps"] >= 2 and rate["tokens_per_s"] > 0
    fit = result["fit"]
    assert fit["nonfinite"] is None and fit["loss_finite"] and fit["steps"] == 20  # --smoke: 20 steps
    assert [step for step, _ in fit["train_loss"]] == [10, 20]  # the loss every 10 steps
    assert [v["step"] for v in fit["val"]] == [10, 20] and all(1.0 <= v["tau"] <= 5.0 for v in fit["val"])
    md = (out / "gpu_fit_cpu_smoke.md").read_text()
    assert md.count("\n| fit tokens/s, ") == 2 and "| val τ_est every 10 steps |" in md and "| kernels: 2 padded" in md
