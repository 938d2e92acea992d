"""Small helpers shared by the viz modules: accept a Trace or its dict, read its thresholds.

`via_sd.core.trace` is imported only when a plain dict has to become a Trace, so `import viz` stays
light even when `via_sd/__init__` pulls in the engine.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from via_sd.core.trace import Trace

KEPT_DECISIONS = ("accepted", "kept")


def as_trace(trace: Any) -> "Trace":
    """A Trace from a Trace, its dict (`Trace.to_dict()`) or its JSON text."""
    if hasattr(trace, "rounds") and hasattr(trace, "tokens"):
        return trace
    from via_sd.core.trace import Trace

    if isinstance(trace, str):
        return Trace.from_json(trace)
    if isinstance(trace, dict):
        return Trace.from_dict(trace)
    raise TypeError(f"expected a via_sd Trace (or its dict / JSON), got {type(trace).__name__}")


def as_traces(traces: Any) -> list:
    if hasattr(traces, "rounds") or isinstance(traces, (dict, str)):
        return [as_trace(traces)]
    return [as_trace(t) for t in traces]


def thresholds_dict(thresholds: Any) -> dict | None:
    """{accept, escalate, signal} from a `via_sd.core.plan.Thresholds`, a dict, or None."""
    if thresholds is None:
        return None
    if isinstance(thresholds, dict):
        get = thresholds.get
    else:
        def get(key, default=None):
            return getattr(thresholds, key, default)
    accept, escalate = get("accept"), get("escalate")
    if accept is None or escalate is None:
        raise ValueError("thresholds need both `accept` and `escalate`")
    accept, escalate = float(accept), float(escalate)
    if not 0.0 <= escalate <= accept <= 1.0:
        raise ValueError(f"need 0 <= escalate <= accept <= 1, got escalate={escalate}, accept={accept}")
    return {"accept": accept, "escalate": escalate, "signal": get("signal", "slim") or "slim"}


def trace_thresholds(trace) -> dict | None:
    """The thresholds a VIA-SD trace ran with (None for AR / SD traces or when missing)."""
    if trace.method != "via":
        return None
    th = (trace.config or {}).get("thresholds")
    return thresholds_dict(th) if th else None


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_prob(x: Any) -> str:
    return f"{x:.3f}" if is_number(x) else "—"


def is_greedy(trace) -> bool:
    temp = (trace.config or {}).get("temperature", 0.0)
    return not temp or float(temp) <= 0.0
