"""What one run did, read from its trace: every forward call per model (as recorded), and the run's record."""

from __future__ import annotations

from ..core.trace import KEPT_DECISIONS

PHASES = ("prefill", "draft", "slim", "full", "other")
MODELS = ("drafter", "slim", "full")


def forward_calls(trace) -> list[tuple[str, int, int]]:
    """Every forward call as (model, round, tokens fed), as the engine recorded it (`round["calls"]`)."""
    if any("calls" not in r for r in trace.rounds):
        raise ValueError("this trace does not record its forward calls (made by an engine before the cost model): "
                         "run it again")
    return [(c["model"], r["round"], c["rows"]) for r in trace.rounds for c in r["calls"]]


def call_lengths(trace) -> dict[str, list[int]]:
    """Tokens fed to the drafter, slim and full verifier in each of their forward calls, in order."""
    out = {m: [] for m in MODELS}
    for model, _, n in forward_calls(trace):
        out[model].append(n)
    return out


def call_costs(trace) -> dict:
    """Each model's forward calls apart from its prompt reads ("steady": ms, calls, tokens fed; what a call costs
    while decoding) and its prompt reads ("prompt_reads": the same; what a run pays once). From each call's
    own clock where the trace has it: a drafter reads its prompt in SD's round 1, beside its first drafts. A trace
    without them gives the rounds after the first (whose first calls read the prompt) and no prompt reads."""
    rounds = [(r["round"], c) for r in trace.rounds for c in r["calls"]]
    if all("ms" in c for _, c in rounds):
        def tally(prompt: bool) -> dict:
            by = {m: [c for _, c in rounds if c["model"] == m and bool(c.get("prompt")) == prompt] for m in MODELS}
            return {"ms": {m: sum(c["ms"] for c in cs) for m, cs in by.items()},
                    "calls": {m: len(cs) for m, cs in by.items()},
                    "fed": {m: sum(c["rows"] for c in cs) for m, cs in by.items()}}
        return {"steady": tally(False), "prompt_reads": tally(True)}
    later = [r for r in trace.rounds if r["round"] > 0]
    steady = {"ms": {m: sum(r[f"{p}_ms"] for r in later) for m, p in zip(MODELS, ("draft", "slim", "full"))},
              "calls": {m: sum(1 for k, c in rounds if c["model"] == m and k > 0) for m in MODELS},
              "fed": {m: sum(c["rows"] for k, c in rounds if c["model"] == m and k > 0) for m in MODELS}}
    return {"steady": steady, "prompt_reads": None}


def trace_record(trace, wall_ms: float) -> dict:
    s = trace.summary
    gamma = max([r.get("gamma") or 0 for r in trace.rounds] + [len(r["candidates"]) for r in trace.rounds] + [1])
    drafted, kept = [0] * gamma, [0] * gamma
    for r in trace.rounds:
        for c in r["candidates"]:
            drafted[c["pos"]] += 1
            kept[c["pos"]] += c["decision"] in KEPT_DECISIONS
    phase = {"prefill": s["prefill_ms"]}
    gammas = [r.get("gamma", gamma) for r in trace.rounds if r["candidates"]]
    phase.update({p: sum(r[f"{p}_ms"] for r in trace.rounds) for p in ("draft", "slim", "full")})
    phase["other"] = max(wall_ms - sum(phase.values()), 0.0)  # loop overhead, prompt encoding, text
    calls = forward_calls(trace)
    n = s["new_tokens"]
    return {
        "tokens_per_s": 1000.0 * n / wall_ms if wall_ms > 0 else 0.0,
        "predicted_tokens_per_s": s.get("predicted_tokens_per_s"),
        "gamma_mean": sum(gammas) / len(gammas) if gammas else 0.0,
        "decode_tokens_per_s": s["tokens_per_s"], "wall_ms": wall_ms, "new_tokens": n,
        "prompt_tokens": s["prompt_tokens"], "token_ids": list(trace.token_ids), "rounds": len(trace.rounds),
        "drafted": sum(drafted), "kept": sum(kept), "drafted_by_position": drafted, "kept_by_position": kept,
        "checked": sum(c["decision"] in ("kept", "replaced") for r in trace.rounds for c in r["candidates"]),
        "replaced": sum(c["decision"] == "replaced" for r in trace.rounds for c in r["candidates"]),
        "tier_counts": dict(s["tier_counts"]), "drafter_calls": sum(drafted), "slim_calls": s.get("slim_calls", 0),
        "full_calls": s["full_calls"], "phase_ms": phase,
        "call_lengths": {m: [c for model, _, c in calls if model == m] for m in MODELS},
        **call_costs(trace),
        "route": trace.models.get("route"), "skipped": list(trace.models.get("skipped") or []),
        "thresholds": trace.config["thresholds"] if trace.method == "via" else None,
    }
