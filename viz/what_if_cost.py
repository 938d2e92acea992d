"""What a replayed round costs: each pass the what-if replays, priced by the engine's cost model
(`via_sd.cost.model`, pure Python) with the cost profile the trace carries, for the rows it really reads."""

from __future__ import annotations

from via_sd.cost.model import CostProfile, call_ms


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
