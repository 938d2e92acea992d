"""Keeping a cost profile honest: the passes runs recorded correct its level when its prices part from them.

Every forward a run makes is in its trace with its rows and, since the engine times them, its milliseconds
(`round["calls"][i]["ms"]`). `Evidence` keeps the latest of those per kind of pass (a verifier pass over k rows,
a slim one, a resumed one, a drafter step, a prompt read) with the run that made it.

Runs are timed at different loads (a Space's other visitors, a browser on the same laptop drawing the page, a VM
that drifts), so passes are compared only through their run: each run's *load* is how much slower than the profile
its passes ran (the median over its kinds of pass, each kind's own median of measured / predicted, so neither the
many drafter steps nor one stalled pass decide it; its one prompt read only when it has nothing else: a run's first
pass pays for what the run's start does around it), and the profile's *level* is the median of the runs' loads.

A profile's shape (V(k), c = draft / verify, the slim and resumed passes as fractions of the full one) decides the
predicted speed-ups and gamma="auto"; its level only the predicted milliseconds. The shape is measured with every
pass timed together, five sweeps, at one moment (via_sd.core.profile.measure: at set-up, by `python -m via_sd
profile --refresh`, or for a shipped prior); a few short runs re-fitting it made the predictions worse: replayed
over the timed passes of 14 comparisons in the app, the speed-ups predicted with the shape kept were within 14% /
12% (median worst error, a browser on the machine / a remote client), re-fitted point by point 15-27% / 20-22%,
curve by curve 14-26% / 15-16% (BENCHMARKS.md, 2026-12-04 night). So runs correct the level (`corrected`: every
price times the level) and report the shape (`error`: per curve, the median of predicted / measured over its passes,
each brought to the level first), and `keep_honest` corrects a profile whose level is off by more than TOLERANCE,
so that the page's predicted tokens/s follow the machine while gamma="auto" does not chase noise. Pure Python, as
model.py.
"""

from __future__ import annotations

import statistics
from collections import deque

from .model import CostProfile, call_ms, reads_prompt

TOLERANCE = 0.10  # a level off by more than this is corrected
WINDOW = 24       # passes kept per kind: the latest runs', so a machine that drifts is followed


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

    def add_run(self, trace) -> int:
        """The timed calls of one run (a Trace or its dict), its drafter steps only when the profile's model drafter
        made them. Returns how many it took."""
        rounds = trace["rounds"] if isinstance(trace, dict) else trace.rounds
        models = (trace.get("models") if isinstance(trace, dict) else trace.models) or {}
        return self.add_rounds(rounds, drafter=models.get("drafter_kind", "model") == "model")

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
        """({run: its load}, the level): a run's load is the median over its kinds of pass of each kind's median
        measured / predicted under `profile`; the level is the median of the runs' loads (1.0 with no passes)."""
        ratios: dict = {}  # run -> curve -> [measured / predicted]
        for (curve, _), passes in self.passes.items():
            for call, ms, run in passes:
                ratios.setdefault(run, {}).setdefault(curve, []).append(ms / call_ms(profile, call))
        loads = {run: statistics.median(statistics.median(r) for c, r in kinds.items() if c != "prompt" or len(kinds) == 1)
                 for run, kinds in ratios.items()}
        return loads, statistics.median(loads.values()) if loads else 1.0

    def level(self, profile: CostProfile) -> float:
        """How much slower (> 1) or faster than `profile` the recorded runs ran: the median of their loads."""
        return self.loads(profile)[1]

    def error(self, profile: CostProfile) -> dict[str, tuple[float, int]]:
        """{curve: (median of predicted / measured over its recorded passes, each brought from its run's load to the
        level, how many)}: how far the profile's shape is from the runs' (1.0 everywhere: the runs' shape)."""
        loads, level = self.loads(profile)
        ratios: dict[str, list[float]] = {}
        for (curve, _), passes in self.passes.items():
            ratios.setdefault(curve, []).extend(call_ms(profile, call) * loads[run] / (ms * level)
                                                for call, ms, run in passes)
        return {curve: (statistics.median(r), len(r)) for curve, r in ratios.items()}

    def corrected(self, profile: CostProfile, source: str) -> CostProfile:
        """`profile` at the runs' level (every price times it; its shape as measured), labelled `source`."""
        return profile.times(self.level(profile), source)


def keep_honest(profile: CostProfile, evidence: Evidence, origin: str) -> CostProfile:
    """`profile`, or, when the recorded runs' level parts from it by more than TOLERANCE, the profile at their level,
    its source saying so ("<origin>, corrected from the passes of N runs on this machine")."""
    level = evidence.level(profile)
    if abs(level - 1) <= TOLERANCE:
        return profile
    return profile.times(level, f"{origin}, corrected from the passes of {evidence.runs} "
                                f"run{'s' if evidence.runs != 1 else ''} on this machine")
