"""The one table of what each setting allows (`BOUNDS`): `DecodeConfig` and `Thresholds` check their fields with it,
the trace gate (`trace_check`) the settings a trace records, the app (`studio.inputs`) what a visitor sends, and
docs/api.md's JSON Schemas are written from it. Plain Python: nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass

MAX_NEW_TOKENS = 4096
MAX_FIXED_GAMMA = 64
SEED_MAX = 2**32 - 1


@dataclass(frozen=True)
class Bound:
    """One setting's allowed values."""

    whole: bool  # a whole number (JSON integer), else any finite number
    lo: float
    hi: float

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return False
        return (not self.whole or float(value).is_integer()) and self.lo <= value <= self.hi

    @property
    def allowed(self) -> str:
        """In words: "a whole number from 1 to 4,096"."""
        kind = "a whole number" if self.whole else "a number"
        return f"{kind} from {self.lo:,g} to {self.hi:,}" if self.whole else f"{kind} from {self.lo:g} to {self.hi:g}"

    def json_schema(self) -> dict:
        plain = [int(x) if float(x).is_integer() else x for x in (self.lo, self.hi)]  # 1.0 -> 1, as JSON writes it
        return {"type": "integer" if self.whole else "number", "minimum": plain[0], "maximum": plain[1]}


BOUNDS = {
    "gamma": Bound(True, 1, MAX_FIXED_GAMMA),  # or "auto"
    "max_new_tokens": Bound(True, 1, MAX_NEW_TOKENS),
    "temperature": Bound(False, 0.0, 5.0),  # 0 = greedy
    "seed": Bound(True, 0, SEED_MAX),
    "accept": Bound(False, 0.0, 1.0),
    "escalate": Bound(False, 0.0, 1.0),  # and at most accept
    "draft_stop": Bound(False, 0.0, 1.0),
    "lookup_ngram": Bound(True, 1, 16),
    "lookup_tokens": Bound(True, 1, MAX_FIXED_GAMMA),
}
