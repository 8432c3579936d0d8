"""``make engine-test`` runs its tests on two pytest-xdist workers with ``--dist loadgroup``: every vLLM test on one
(one engine at a time binds the cores), the peers' on the other, and a module fixture (a peer's 4-minute fit, a
served vLLM) set up once per module. That rests on ``tests/conftest.py``'s groups, given before xdist's own hook
reads them, and on xdist honouring them, which pytest 9.2 silently broke (pytest-dev/pytest-xdist#1386). Either fault
spreads the tests over both workers and re-runs module fixtures per test: CI's engine tests took 19 minutes on the
AMD EPYC (2026-12-06), two peer fits each run twice, and vLLM tests beside each other. This runs the real hook,
pytest and xdist of this venv on two small files per group and fails where a group is split or a module fixture is
set up twice."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

MODULE = """
import pytest

pytestmark = pytest.mark.engine
SETUPS = []


@pytest.fixture(scope="module")
def fitted():
    SETUPS.append(1)
    return len(SETUPS)


def test_one(fitted):
    assert fitted == 1, "the module fixture was set up again"


def test_two(fitted):
    assert fitted == 1, "the module fixture was set up again"


def test_three(fitted):
    assert fitted == 1, "the module fixture was set up again"
"""


def test_engine_tests_keep_their_group_on_one_worker_and_a_module_fixture_runs_once(tmp_path):
    (tmp_path / "conftest.py").write_text(  # the suite's own hook, loaded under another name than this conftest's
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine: engine\n")
    for name in ("test_a_vllm.py", "test_b_vllm.py", "test_c_peer.py", "test_d_peer.py"):
        (tmp_path / name).write_text(MODULE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED (test_\w+)\.py", proc.stdout)
    assert len(ran) == 12, proc.stdout[-3000:]
    workers = {group: {w for w, f in ran if f.endswith(group)} for group in ("vllm", "peer")}
    assert all(len(w) == 1 for w in workers.values()), workers  # each group whole on one worker
    assert workers["vllm"] != workers["peer"], workers  # and the two groups beside each other
