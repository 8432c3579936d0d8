"""Files and directories written whole: a reader (or a process killed mid-write) never sees half of one, and two
processes that need the same cached directory (a converted target, an unpacked corpus; two commands, two test
workers) take turns, the second finding it made instead of deleting the first one's half-written ``.tmp``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


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
    """Run ``make(tmp)`` on a fresh ``OUT.tmp`` sibling, then put that directory in ``out``'s place (replacing what
    was there): ``out`` is never half made."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    make(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


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
