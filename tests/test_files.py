"""``core.files``: two processes that make the same cached directory take turns (the second finds it made), and a
directory or file is never seen half written."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from draftsmith.core.files import building, made_once, write_whole


def hold(out: Path, log: Path) -> None:
    with building(out):
        log.write_text("child in\n")
        time.sleep(0.5)
        with log.open("a") as f:
            f.write("child out\n")


def started(target, out: Path, log: Path) -> multiprocessing.Process:
    """A child process running ``target(out, log)``, returned once it has written its log."""
    child = multiprocessing.get_context("spawn").Process(target=target, args=(out, log))
    child.start()
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return child


def test_a_second_builder_waits_for_the_first(tmp_path):
    out, log = tmp_path / "cache" / "entry", tmp_path / "log"
    child = started(hold, out, log)
    with building(out), log.open("a") as f:
        f.write("parent in\n")
    child.join(60)
    assert child.exitcode == 0
    assert log.read_text().splitlines() == ["child in", "child out", "parent in"]
    assert (tmp_path / "cache" / ".entry.lock").is_file() and not out.exists()


def is_made(out: Path) -> bool:
    return (out / "done").is_file()


def slow_make(log: Path):
    def make(tmp: Path) -> None:
        with log.open("a") as f:
            f.write("make\n")
        tmp.mkdir()
        (tmp / "part").write_text("half")
        time.sleep(0.5)
        (tmp / "done").write_text("whole")

    return make


def make_once(out: Path, log: Path) -> None:
    made_once(out, is_made, slow_make(log))


def test_two_processes_asking_for_one_entry_make_it_once(tmp_path):
    out, log = tmp_path / "cache" / "entry", tmp_path / "log"
    child = started(make_once, out, log)
    assert not is_made(out)  # the child is making it: nothing half made is in place
    assert made_once(out, is_made, slow_make(log)) == out
    child.join(60)
    assert child.exitcode == 0
    assert log.read_text().splitlines() == ["make"]
    assert sorted(p.name for p in out.iterdir()) == ["done", "part"]
    assert not (tmp_path / "cache" / "entry.tmp").exists()


def test_a_make_that_fails_leaves_no_entry_and_force_makes_it_again(tmp_path):
    out, log = tmp_path / "entry", tmp_path / "log"

    def broken(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "part").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        made_once(out, is_made, broken)
    assert not out.exists()
    made_once(out, is_made, slow_make(log))
    made_once(out, is_made, slow_make(log))
    made_once(out, is_made, slow_make(log), force=True)
    assert log.read_text().splitlines() == ["make", "make"]


def test_write_whole_makes_its_folder_replaces_a_file_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "new" / "a.json"
    write_whole(path, "old")
    write_whole(path, "new")
    assert path.read_text() == "new" and [p.name for p in path.parent.iterdir()] == ["a.json"]
