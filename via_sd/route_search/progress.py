"""Progress reports and stop requests, shared by the search, the calibration and the resolver."""

from __future__ import annotations

import time


def report(progress, message: str, fraction: float) -> None:
    if progress is not None:
        progress(message, min(max(fraction, 0.0), 1.0))


def stopped(stop) -> bool:
    return stop is not None and stop.is_set()


class Budget:
    """A stop switch that is set when `stop` is, or once `seconds` have passed since it was made (None: never)."""

    def __init__(self, stop=None, seconds: float | None = None):
        self.stop, self.seconds = stop, seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds

    @property
    def spent(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def is_set(self) -> bool:
        return stopped(self.stop) or self.spent
