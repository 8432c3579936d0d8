"""A benchmark given a bad argument stops at once with one line naming it, before it loads any model."""

from __future__ import annotations

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
