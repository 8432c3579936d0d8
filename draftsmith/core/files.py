"""One builder at a time for a cached directory (a converted target, an unpacked corpus): two processes that need
the same entry (two commands, two test workers) take turns, and the second finds it built instead of deleting the
first one's half-written ``.tmp``."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
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
