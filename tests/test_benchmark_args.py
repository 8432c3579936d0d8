"""A benchmark given a bad argument stops at once with one line naming it, before it loads any model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
