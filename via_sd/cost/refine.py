"""Keeping a cost profile honest: the passes runs recorded correct it where its predictions part from them.

Every forward a run makes is in its trace with its rows and, since the engine times them, its milliseconds
(`round["calls"][i]["ms"]`). `Evidence` keeps the latest of those per kind of pass (a verifier pass over k rows,
a slim one, a resumed one, a drafter step, a prompt read) with the run that made it.

Runs are timed at different loads (a Space's other visitors, a second job, a VM that drifts), and a profile's
worth is in the ratios of its prices: slim(k) against verify(k) decides whether VIA-SD's rounds pay. So passes are
compared only through their run: each run's *load* is how much slower than the profile its passes ran (the median
over its kinds of pass, each kind's own median of measured / predicted, so neither the many drafter steps nor one
stalled pass decide it), and every pass is first brought to the *common load*, the median of the runs' loads. A
kind of pass no run timed next to others then keeps the profile's shape and takes the common level; SD's verify(3)
timed on a busy machine and VIA-SD's slim(3) timed on a quiet one no longer make the slim verifier look cheap.

`error` says how far a profile's prices are from those passes (per curve: the median over calls of predicted /
measured at the common load); `corrected` is the profile with every point that at least AT_LEAST passes hit
replaced by their median, every other point scaled by its curve's median error (a curve no run hit: by the
common level), the curve made non-decreasing (more rows never cost less) and scaled so its median prediction
equals its passes again. `keep_honest` corrects a profile only when some curve is off by more than `TOLERANCE`:
a profile that prices runs well stays as it is, so gamma="auto" does not chase noise. Pure Python, as model.py.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace

from .model import CostProfile, call_ms, reads_prompt

TOLERANCE = 0.10  # a curve whose median prediction is off by more than this is corrected
WINDOW = 24       # passes kept per kind: the latest runs', so a machine that drifts is followed
AT_LEAST = 3      # passes of one kind before that point is replaced by their median
CURVES = ("verify_ms", "slim_ms", "resume_ms", "draft_ms", "prompt")


def kind_of(call: dict) -> tuple[str, object] | None:
    """(curve, point) a recorded forward measures: ("verify_ms", k), ..., ("prompt", (model, rows)); None for a
    call without rows."""
    model, rows = call.get("model"), int(call.get("rows") or 0)
    if rows <= 0 or model not in ("drafter", "slim", "full"):
        return None
    if reads_prompt(call):
        return "prompt", (model, rows)
    curve = {"drafter": "draft_ms", "slim": "slim_ms"}.get(model) or ("resume_ms" if call.get("resume") else "verify_ms")
    return curve, rows


class Evidence:
    """The latest recorded passes with their milliseconds and their run, per (curve, point)."""

    def __init__(self, window: int = WINDOW):
        self.window = window
        self.passes: dict = {}  # (curve, point) -> deque of (call, ms, run)
        self.runs = 0

    def add_rounds(self, rounds: list[dict], drafter: bool = True) -> int:
        """The timed calls of one run's rounds (one method's decode: its passes share a load); `drafter` False
        leaves its drafter steps out (a lookup or an early exit drafts at another price than the profile's model
        drafter). Returns how many it took."""
        taken, run = 0, self.runs
        for rnd in rounds:
            for call in rnd.get("calls") or ():
                ms = call.get("ms")
                kind = kind_of(call)
                if kind is None or not isinstance(ms, (int, float)) or not ms > 0:
                    continue
                if kind[0] == "draft_ms" and not drafter:
                    continue
                self.passes.setdefault(kind, deque(maxlen=self.window)).append((call, float(ms), run))
                taken += 1
        self.runs += bool(taken)
        return taken

    def loads(self, profile: CostProfile) -> tuple[dict, float]:
        """({run: its load}, the common load): a run's load is the median over its kinds of pass of each kind's
        median measured / predicted under `profile`; the common load is the median of the runs' loads."""
        ratios: dict = {}  # run -> curve -> [measured / predicted]
        for (curve, _), passes in self.passes.items():
            for call, ms, run in passes:
                ratios.setdefault(run, {}).setdefault(curve, []).append(ms / call_ms(profile, call))
        loads = {run: statistics.median(statistics.median(r) for r in kinds.values()) for run, kinds in ratios.items()}
        return loads, statistics.median(loads.values()) if loads else 1.0

    def leveled(self, profile: CostProfile) -> tuple[dict, float]:
        """({(curve, point): [ms of each pass, brought to the common load]}, the common load)."""
        loads, common = self.loads(profile)
        return {kind: [ms * common / loads[run] for _, ms, run in passes]
                for kind, passes in self.passes.items()}, common

    def error(self, profile: CostProfile) -> dict[str, tuple[float, int]]:
        """{curve: (median of predicted / measured over its recorded passes at the common load, how many)}; 1.0 is
        an honest curve."""
        leveled, _ = self.leveled(profile)
        ratios: dict[str, list[float]] = {}
        for kind, passes in self.passes.items():
            ratios.setdefault(kind[0], []).extend(call_ms(profile, call) / ms
                                                  for (call, _, _), ms in zip(passes, leveled[kind]))
        return {curve: (statistics.median(r), len(r)) for curve, r in ratios.items()}

    def off(self, profile: CostProfile, tolerance: float = TOLERANCE) -> dict[str, float]:
        """The curves whose prices part from the recorded passes by more than `tolerance`: {curve: ratio}."""
        return {c: r for c, (r, n) in self.error(profile).items() if n >= AT_LEAST and abs(r - 1) > tolerance}

    def corrected(self, profile: CostProfile, source: str) -> CostProfile:
        """`profile` re-fitted to the recorded passes (see the module's docstring), labelled `source`."""
        error = self.error(profile)
        leveled, common = self.leveled(profile)
        fields = {}
        for curve in ("verify_ms", "slim_ms", "resume_ms", "draft_ms"):
            scale = 1 / error[curve][0] if curve in error else common
            values = []
            for k, old in enumerate(getattr(profile, curve), start=1):
                passes = leveled.get((curve, k), ())
                values.append(statistics.median(passes) if len(passes) >= AT_LEAST else old * scale)
            fields[curve] = non_decreasing(values)
        fitted = replace(profile, **fields)
        for curve, (ratio, _) in self.error(fitted).items():
            if curve in fields:  # smoothing moved a curve's points: bring its median prediction back onto the passes
                fields[curve] = tuple(v / ratio for v in fields[curve])
        fields["prompt_ms"] = self._prompts(profile, leveled, common)
        return replace(profile, source=source, **fields)

    def _prompts(self, profile: CostProfile, leveled: dict, common: float) -> dict:
        """Each model's prompt-read curve scaled by the median error of its own recorded reads (too few: by the
        common level)."""
        out = {}
        for model, curve in profile.prompt_ms.items():
            ratios = [call_ms(profile, call) / ms for kind, passes in self.passes.items()
                      if kind[0] == "prompt" and kind[1][0] == model
                      for (call, _, _), ms in zip(passes, leveled[kind])]
            scale = 1 / statistics.median(ratios) if len(ratios) >= AT_LEAST else common
            out[model] = {n: v * scale for n, v in curve.items()}
        return out


def non_decreasing(values) -> tuple:
    """More rows never cost less: the closest non-decreasing curve (pool-adjacent-violators), so a dip or a
    spike of noise is averaged with its neighbours instead of carried forward."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return tuple(total / count for total, count in blocks for _ in range(count))


def keep_honest(profile: CostProfile, evidence: Evidence, origin: str) -> CostProfile:
    """`profile`, or, when a curve parts from the recorded passes by more than TOLERANCE, the profile corrected from
    them, its source saying so ("<origin>, corrected from the passes of N runs on this machine")."""
    if not evidence.off(profile):
        return profile
    return evidence.corrected(profile, f"{origin}, corrected from the passes of {evidence.runs} "
                                       f"run{'s' if evidence.runs != 1 else ''} on this machine")
