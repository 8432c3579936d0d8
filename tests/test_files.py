"""``core.files.building``: two processes that build the same cached directory take turns."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from draftsmith.core.files import building


def hold(out: Path, log: Path) -> None:
    with building(out):
        log.write_text("child in\n")
        time.sleep(0.5)
        with log.open("a") as f:
            f.write("child out\n")


def test_a_second_builder_waits_for_the_first(tmp_path):
    out, log = tmp_path / "cache" / "entry", tmp_path / "log"
    child = multiprocessing.get_context("spawn").Process(target=hold, args=(out, log))
    child.start()
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with building(out), log.open("a") as f:
        f.write("parent in\n")
    child.join(60)
    assert child.exitcode == 0
    assert log.read_text().splitlines() == ["child in", "child out", "parent in"]
    assert (tmp_path / "cache" / ".entry.lock").is_file() and not out.exists()
