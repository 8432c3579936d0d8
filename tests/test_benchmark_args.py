"""A benchmark given a bad argument stops at once with one line naming it, before it loads any model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bf16_target_refuses_a_drafter_that_is_not_a_trained_one(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/bf16_target.py",
            "--out",
            str(tmp_path),
            "--drafters",
            "mine=runs/no-such-drafter",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "bf16_target.py: error: --drafters mine: not a trained drafter (a .ckpt or an exported drafter's dir)"
    )
    assert not any(tmp_path.iterdir())  # stopped before measuring anything


def scaling(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/scaling.py", "--stages", "data", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_scaling_refuses_a_corpus_that_is_no_packed_file(tmp_path):
    run = scaling("--out", str(tmp_path), "--corpus", str(tmp_path / "corpus.tar.xz"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--corpus" in run.stderr.strip().splitlines()[-1] and "no packed corpus file" in run.stderr
    assert not any(tmp_path.iterdir())


def test_scaling_never_mixes_a_generated_corpus_with_the_packed_one(tmp_path):
    """A run dir whose corpus was generated here refuses the packed corpus, and one holding the packed corpus
    refuses to generate: subsets, feature caches and fits of two corpora never meet in one run dir."""
    generated, packed = tmp_path / "generated", tmp_path / "packed"
    (generated / "data" / "train").mkdir(parents=True)
    (generated / "data" / "train" / "draftsmith.json").write_text('{"status": "complete", "settings": {}}')
    (packed / "data" / "train").mkdir(parents=True)
    (packed / "data" / "train" / "draftsmith.json").write_text('{"status": "complete", "packed": {"sha256": "x"}}')
    corpus = tmp_path / "corpus.tar.xz"
    corpus.write_bytes(b"not read: the run dir is refused first")
    run = scaling("--out", str(generated), "--corpus", str(corpus))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "holds another corpus" in run.stderr.strip().splitlines()[-1]
    run = scaling("--out", str(packed), "--corpus", "generate")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "holds the packed corpus" in run.stderr.strip().splitlines()[-1]


def test_dspark_refuses_a_study_without_its_drafters(tmp_path):
    run = subprocess.run(
        [sys.executable, "benchmarks/dspark.py", "--study", str(tmp_path / "study"), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dspark.py: error: {tmp_path / 'study' / 'drafters' / 'eagle3-1M'}: no trained drafter")
    assert "benchmarks/scaling.py" in last and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drafters", "eagle3-1M", "lk-1M"], "no trained drafter lk-1M in {drafters} (blocks to score decode it; "
         "no saved block in {out} or earlier none.json holds them)"),
        (["--drafters", "eagle3-1M", "--add", "16k-1M"], "no trained drafter 16k-1M in {drafters} (blocks to score "
         "decode it; no saved block in {out} or earlier none.json holds them)"),
        (["--drafters", "eagle3-1M", "--add", "eagle3-1M"], "--add eagle3-1M: already one of --drafters (scored in "
         "the main blocks)"),
    ],
)  # fmt: skip
def test_recipe_refuses_a_drafter_the_study_has_not_trained_or_scores_twice(tmp_path, extra, message):
    (tmp_path / "drafters" / "eagle3-1M").mkdir(parents=True)
    (tmp_path / "drafters" / "eagle3-1M" / "config.json").write_text("{}")
    elsewhere = ["--out", str(tmp_path / "out"), "--results", "none"]  # no saved block stands in
    run = subprocess.run(
        [sys.executable, "benchmarks/recipe.py", "--study", str(tmp_path), "--base", "eagle3-1M", *extra, *elsewhere],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last == "recipe.py: error: " + message.format(drafters=tmp_path / "drafters", out=tmp_path / "out")


@pytest.mark.parametrize(
    ("drafters", "base", "message"),
    [
        (["mine"], "mine", "argument --drafter: --drafter mine: expected NAME=DIR"),
        (["mine={tmp}/none", "theirs={tmp}/theirs"], "mine", "--drafter mine={tmp}/none: no drafter there (no "
         "config.json); train and import it first"),
        (["theirs={tmp}/theirs"], "draftsmith", "--base draftsmith: not one of the --drafter names (theirs)"),
    ],
)  # fmt: skip
def test_peers_refuses_a_drafter_that_is_not_there_before_loading_the_target(tmp_path, drafters, base, message):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "config.json").write_text("{}")
    args = [a for d in drafters for a in ("--drafter", d.format(tmp=tmp_path))]
    run = subprocess.run(
        [sys.executable, "benchmarks/peers.py", *args, "--base", base, "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "peers.py: error: " + message.format(tmp=tmp_path)
    assert not (tmp_path / "out").exists()


def test_peers_fits_table_gives_the_training_rate_alone_where_a_record_timed_its_validations(tmp_path):
    """``peers.py``'s fits: each trainer's validations out of its rate where its record times them apart (draftsmith's
    ``ValidationClock``, speculators' ``val_seconds``; SpecForge validates nothing), the column absent from reports
    whose records have none (those written before), ``--fits-only`` refusing a drafter without a record."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    study, records = (
        tmp_path / "study",
        {
            "new": {"seconds": 100.0, "validation_seconds": 60.0, "tokens": 1000, "epochs": 1.0, "steps": 4},
            "old": {"seconds": 100.0, "tokens": 1000, "epochs": 1.0, "steps": 4},
        },
    )
    (study / "fit").mkdir(parents=True)
    for name, record in records.items():
        (study / "fit" / f"{name}.json").write_text(json.dumps(record))
    for trainer, record in {
        "speculators": {"fit_seconds": 50.0, "val_seconds": 5.0, "train_process_seconds": 60.0, "passes": 1.0},
        "specforge": {"fit_seconds": 20.0, "passes": 1.0},
    }.items():
        (tmp_path / trainer).mkdir()
        (tmp_path / trainer / "fit.json").write_text(json.dumps({"trainer": trainer, "tokens": 1000, **record}))
    fits = {
        "new": peers.fit_record(study / "drafters" / "new"),
        "old": peers.fit_record(study / "drafters" / "old"),
        "speculators": peers.fit_record(tmp_path / "speculators" / "imported"),
        "specforge": peers.fit_record(tmp_path / "specforge" / "imported"),
    }
    alone = {n: (f.get("validation_seconds"), f.get("train_tokens_per_s"), f["tokens_per_s"]) for n, f in fits.items()}
    assert alone == {
        "new": (60.0, 25.0, 10.0), "old": (None, None, 10.0), "speculators": (5.0, 20.0, 16.7), "specforge": (0.0, 50.0, 50.0)
    }  # fmt: skip
    machine = {"command": "c", "git": "g", "date": "d", "cpu": "cpu", "cpu_flags": [], "threads": 2, "torch": "t"}
    result = {"machine": machine, "base": "new", "blocks": {}, "drafters": {n: {"fit": f} for n, f in fits.items()}}
    table = peers.markdown(result)
    assert "| validation s | tokens/s, training alone |" in table and "| 100 | 10 | 60 | 25 |" in table
    assert "| 100 | 10 | – | – |" in table  # the record without them
    before = peers.markdown({**result, "drafters": {"old": {"fit": fits["old"]}}})
    assert "training alone" not in before and "| 100 | 10 | – |" in before  # a report of such records only: as before
    run = subprocess.run(
        [sys.executable, "benchmarks/peers.py", "--fits-only", "--drafter", f"draftsmith={tmp_path / 'none'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2 and "no fit record beside it" in run.stderr.strip().splitlines()[-1]
