"""The pipeline's progress: each stage's header with its estimated time, and the time each took."""

from __future__ import annotations

import time

from draftsmith.pipeline.stages import STAGES


class Progress:
    """Prints each stage's header with its estimated time, and records the time it took."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.seconds, self.estimates = names, {}, {}
        self.started, self.current = time.perf_counter(), None

    def start(self, name: str, estimate_s: float | None = None) -> None:
        self.stop()
        self.current, self.at = name, time.perf_counter()
        guess = f" (estimated {duration(estimate_s)})" if estimate_s else ""
        if estimate_s:
            self.estimates[name] = round(estimate_s)
        print(f"[{self.names.index(name) + 1}/{len(self.names)}] {name}: {STAGES[name]}{guess}", flush=True)

    def stop(self) -> None:
        if self.current:
            self.seconds[self.current] = round(time.perf_counter() - self.at, 1)
            self.current = None

    def summary(self) -> dict:
        self.stop()
        total = round(time.perf_counter() - self.started, 1)
        return {"stages_seconds": self.seconds, "estimated_seconds": self.estimates, "total_seconds": total}


def duration(seconds: float) -> str:
    """A time as the stage lines print it: seconds under 90, else minutes, each rounded (``~42 s``, ``~3 min``)."""
    return f"~{seconds:.0f} s" if seconds < 90 else f"~{seconds / 60:.0f} min"
