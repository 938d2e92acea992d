"""What a replayed round costs: each pass the what-if replays, priced by the engine's cost model
(`via_sd.cost.model`, pure Python) with the cost profile the trace carries, for the rows it really reads; or,
for a trace without a profile, the recorded per-phase means (`phase_costs`)."""

from __future__ import annotations

from typing import Any

from via_sd.cost.model import CostProfile, call_ms

from ._trace import as_trace, is_number


def trace_profile(trace) -> CostProfile | None:
    try:
        return CostProfile.from_dict(trace.costs) if getattr(trace, "costs", None) else None
    except ValueError:
        return None


def passes_run(plan, full_called: bool, slim_called: bool) -> dict:
    """The verifier passes a replayed round runs: {verifier: (start, stop)}."""
    out = {}
    if slim_called:
        out["slim"] = plan.slim
    if full_called:
        out["full"] = plan.full
    return out


class Lanes:
    """Follows how far each model's cache has read, round by round, so each replayed pass is priced for the
    rows it really reads (a verifier that skipped rounds catches up on them)."""

    def __init__(self, prompt: int, opening: int = 0):
        """`opening`: prompt tokens every cache started with (the chat opening read once per pair: via_sd.core.opening)."""
        self.length, self.prompt = prompt, prompt
        self.seen = dict.fromkeys(("drafter", "slim", "full"), opening)

    def round_ms(self, profile, cost, n: int, gamma, slim: bool, full: bool, passes, kept: int, emitted: int) -> float:
        """`passes`: {verifier: (start, stop)}, or a recorded round (its own `calls` are priced as they are)."""
        if profile is None:  # no cost profile in the trace: the recorded per-phase means
            ms = n * cost["draft_ms_per_candidate"] + cost["other_ms_per_round"]
            for phase, called in (("slim", slim), ("full", full)):
                if called and cost[f"{phase}_ms_per_call"] is not None:
                    ms += cost[f"{phase}_ms_per_call"]
            return ms
        if isinstance(passes, dict) and "calls" in passes:
            ms = sum(call_ms(profile, c) for c in passes["calls"])
            for c in passes["calls"]:
                self.seen[c["model"]] = c.get("past", 0) + c["rows"]
        else:
            ms = 0.0
            if n:
                ms += self._read(profile, "drafter", self.length, resume=False)
                ms += (n - 1) * profile.draft(1)
                self.seen["drafter"] = self.length + n - 1
            for model in ("slim", "full"):
                if model in passes:
                    start, stop = passes[model]
                    self.seen[model] = min(self.seen[model], self.length + start - 1)
                    ms += self._read(profile, model, self.length + stop, resume=model == "full" and "slim" in passes)
        valid = self.length + min(kept, emitted)
        self.seen = {m: min(s, valid) for m, s in self.seen.items()}
        self.length += emitted
        return ms

    def _read(self, profile, model: str, upto: int, resume: bool) -> float:
        seen, ms = self.seen[model], 0.0
        if seen < self.prompt < upto:  # the prompt is read in a call of its own (via_sd.core.cached.Reader)
            ms += call_ms(profile, {"model": model, "rows": self.prompt - seen, "past": seen, "resume": resume,
                                    "prompt": True})
            seen = self.prompt
        ms += call_ms(profile, {"model": model, "rows": upto - seen, "past": seen, "resume": resume})
        self.seen[model] = upto
        return ms


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def skip_fraction(models: dict) -> float | None:
    """Skip fraction of the slim route if the trace's `models` block names one."""
    stack = [models]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if "fraction" in str(key) and is_number(value) and 0 < value < 1:
                    return float(value)
                stack.append(value)
    return None


def ran_slim_pass(rnd: dict) -> bool:
    """Whether a recorded round ran the slim pass (traces from before `slim_called` tell by its time)."""
    return bool(rnd.get("slim_called", (rnd.get("slim_ms") or 0) > 0))


def phase_costs(trace: Any) -> dict:
    """Mean recorded cost of each phase: drafter per candidate, slim / full per call, other per round."""
    trace = as_trace(trace)
    rounds = trace.rounds
    n_cands = sum(len(r.get("candidates", [])) for r in rounds)
    slim_rounds = [r for r in rounds if ran_slim_pass(r)]
    full_rounds = [r for r in rounds if r.get("full_called")]
    costs = {
        "draft_ms_per_candidate": (sum(r.get("draft_ms") or 0.0 for r in rounds) / n_cands) if n_cands else 0.0,
        "slim_ms_per_call": _mean([float(r.get("slim_ms") or 0.0) for r in slim_rounds]),
        "full_ms_per_call": _mean([float(r.get("full_ms") or 0.0) for r in full_rounds]),
        "other_ms_per_round": _mean([float(r.get("other_ms") or 0.0) for r in rounds]) or 0.0,
    }
    return costs
