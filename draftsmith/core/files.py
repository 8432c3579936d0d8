"""Files and directories written whole: a reader (or a process killed mid-write) never sees half of one, and two
processes that need the same cached directory (a converted target, an unpacked corpus; two commands, two test
workers) take turns, the second finding it made instead of deleting the first one's half-written ``.tmp``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.errors import DraftsmithError


@contextlib.contextmanager
def building(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out``'s hidden sibling ``.OUT.lock`` for the block (released if the process
    dies); check inside the block whether ``out`` was built while waiting."""
    lock = out.with_name(f".{out.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def write_whole(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its folder made if missing) through a ``.tmp`` sibling renamed onto it: the file
    is the old one or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def made_whole(out: Path, make: Callable[[Path], None]) -> Path:
    """Run ``make(tmp)`` on a fresh ``OUT.tmp`` sibling (a directory or a file, as ``make`` writes it), then put it
    in ``out``'s place (replacing what was there): ``out`` is never half made, and until ``make`` has finished it is
    what it was. A ``make`` that raises (a refusal, a crash, Ctrl-C) leaves no ``OUT.tmp``."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    _remove(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        make(tmp)
    except BaseException:
        _remove(tmp)
        raise
    if out.is_dir() and not out.is_symlink():  # a directory cannot be renamed onto: set it aside first
        old = out.with_name(f".{out.name}.old")
        _remove(old)
        out.rename(old)
        tmp.rename(out)
        _remove(old)
    else:
        os.replace(tmp, out)
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def refuse_existing(out: Path, overwrite: bool, command: str) -> None:
    """One line refusing an existing ``--out`` (a file, or a directory with anything in it) unless ``overwrite``:
    checked before any work, so a refusal costs nothing and replaces nothing."""
    out = Path(out)
    if overwrite or not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    held = "exists and is not empty" if out.is_dir() else "exists"
    raise DraftsmithError(f"{command}: --out {out} {held} (pass --overwrite to replace it)")


def made_once(out: Path, is_made: Callable[[Path], bool], make: Callable[[Path], None], force: bool = False) -> Path:
    """``out`` as ``is_made`` finds it, else made whole by ``make(tmp)`` (``made_whole``) under ``building``'s lock:
    a second process asking for it meanwhile waits, then finds it made. ``is_made`` may raise to refuse an ``out``
    that holds something else; ``force`` makes it again."""
    out = Path(out)
    if not force and is_made(out):
        return out
    with building(out):
        if not force and is_made(out):  # made by another process while this one waited
            return out
        return made_whole(out, make)


class Stopwatch:
    """Wall seconds of work that may be interrupted and resumed: the total so far is saved to ``path`` every
    ``every`` seconds (None: as the block ends only) and a later block adds its time to it: the wall time the work
    took, the steps an interruption lost and redid included (a fit's, ``train.recorded``; its validations',
    ``train.cli.ValidationClock``)."""

    def __init__(self, path: Path, every: float | None = 30.0) -> None:
        self.path, self.every = path, every
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.before, self.sessions = saved.get("seconds", 0.0), saved.get("sessions", 0) + 1
        self.done = threading.Event()

    @property
    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.start

    def save(self) -> None:
        # written whole: a kill mid-write leaves the last total
        write_whole(self.path, json.dumps({"seconds": round(self.seconds, 3), "sessions": self.sessions}))

    def _tick(self) -> None:
        while not self.done.wait(self.every):
            self.save()

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        self.thread = threading.Thread(target=self._tick, daemon=True) if self.every else None
        if self.thread:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread:
            self.thread.join()
        self.save()
