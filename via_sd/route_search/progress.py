"""Progress reports and stop requests, shared by the search, the calibration and the resolver."""

from __future__ import annotations


def report(progress, message: str, fraction: float) -> None:
    if progress is not None:
        progress(message, min(max(fraction, 0.0), 1.0))


def stopped(stop) -> bool:
    return stop is not None and stop.is_set()
