"""What one run did, rebuilt from its trace: every forward call per model, and the run's record."""

from __future__ import annotations

from collections import Counter

from ..trace import KEPT_DECISIONS

PHASES = ("prefill", "draft", "slim", "full", "other")
MODELS = ("drafter", "slim", "full")


def prefilled_models(trace) -> set[str]:
    """Models that read the prompt in a separate prefill pass before round 0.

    Today's engine has none (prefill_ms is 0: each model reads the prompt with its first call);
    traces from earlier engines prefilled the models each method needs with all but the last
    prompt token.
    """
    if trace.summary["prompt_tokens"] <= 1 or not trace.summary.get("prefill_ms"):
        return set()
    signal = (trace.config.get("thresholds") or {}).get("signal", "slim")
    return {"ar": {"full"}, "sd": {"drafter", "full"},
            "via": {"drafter", "slim"} if signal == "slim" else {"drafter"}}[trace.method]


def forward_calls(trace) -> list[tuple[str, int, int]]:
    """Every forward call as (model, round, tokens fed); round -1 is a separate prefill.

    Rebuilt from the trace by replaying the engine's cache rule: a verifier pass scores the drafts
    whose q_slim / q_full it recorded (all of them in traces that predate per-position passes) and
    feeds what it has not seen, from the position before the first draft it scores at the latest;
    after a round every cache is cut back to the tokens that were kept. The full verifier (not the
    progressive one) reads the prompt in a call of its own before anything past it (CachedModel);
    traces from engines before 2026-11-30 read both in one call, so their first full call replays as two.
    """
    prompt_len = trace.summary["prompt_tokens"]
    split_prompt = not (trace.method == "via" and trace.config.get("progressive"))
    calls, seen = [], {m: 0 for m in MODELS}
    for m in sorted(prefilled_models(trace)):
        calls.append((m, -1, prompt_len - 1))
        seen[m] = prompt_len - 1
    emitted = Counter(t["round"] for t in trace.tokens)
    length = prompt_len
    for r in trace.rounds:
        k, n_drafts = r["round"], len(r["candidates"])
        if n_drafts:  # one forward per draft; the last draft is not fed until the next round
            calls += [("drafter", k, length - seen["drafter"])] + [("drafter", k, 1)] * (n_drafts - 1)
            seen["drafter"] = length + n_drafts - 1
        for m in ("slim", "full"):
            if r[f"{m}_called"]:
                start, stop = _scored(r["candidates"], m)
                seen[m] = min(seen[m], length + start - 1)  # the row before the first scored draft is fed again
                if m == "full" and split_prompt and seen[m] < prompt_len < length + stop:
                    calls.append((m, k, prompt_len - seen[m]))  # the full verifier reads the prompt alone first
                    seen[m] = prompt_len
                calls.append((m, k, length + stop - seen[m]))
                seen[m] = length + stop
        kept = sum(c["decision"] in KEPT_DECISIONS for c in r["candidates"])
        valid = length + min(kept, emitted[k])
        seen = {m: min(n, valid) for m, n in seen.items()}
        length += emitted[k]
    return calls


def _scored(candidates: list[dict], model: str) -> tuple[int, int]:
    """(first, last + 1) of the draft positions a verifier pass scored; every draft when none is recorded."""
    scored = [c["pos"] for c in candidates if c.get(f"q_{model}") is not None]
    return (min(scored), max(scored) + 1) if scored else (0, len(candidates))


def call_lengths(trace) -> dict[str, list[int]]:
    """Tokens fed to the drafter, slim and full verifier in each of their forward calls, in order."""
    out = {m: [] for m in MODELS}
    for model, _, n in forward_calls(trace):
        out[model].append(n)
    return out


def trace_record(trace, wall_ms: float) -> dict:
    s, gamma = trace.summary, trace.config["gamma"]
    drafted, kept = [0] * gamma, [0] * gamma
    for r in trace.rounds:
        for c in r["candidates"]:
            drafted[c["pos"]] += 1
            kept[c["pos"]] += c["decision"] in KEPT_DECISIONS
    phase = {"prefill": s["prefill_ms"]}
    phase.update({p: sum(r[f"{p}_ms"] for r in trace.rounds) for p in ("draft", "slim", "full")})
    phase["other"] = max(wall_ms - sum(phase.values()), 0.0)  # loop overhead, prompt encoding, text
    calls = forward_calls(trace)
    # per-call costs leave out prefill and round 0, whose first calls also read the prompt
    later = [r for r in trace.rounds if r["round"] > 0]
    n = s["new_tokens"]
    return {
        "tokens_per_s": 1000.0 * n / wall_ms if wall_ms > 0 else 0.0,
        "decode_tokens_per_s": s["tokens_per_s"], "wall_ms": wall_ms, "new_tokens": n,
        "prompt_tokens": s["prompt_tokens"], "token_ids": list(trace.token_ids), "rounds": len(trace.rounds),
        "drafted": sum(drafted), "kept": sum(kept), "drafted_by_position": drafted, "kept_by_position": kept,
        "checked": sum(c["decision"] in ("kept", "replaced") for r in trace.rounds for c in r["candidates"]),
        "replaced": sum(c["decision"] == "replaced" for r in trace.rounds for c in r["candidates"]),
        "tier_counts": dict(s["tier_counts"]), "drafter_calls": sum(drafted), "slim_calls": s.get("slim_calls", 0),
        "full_calls": s["full_calls"], "phase_ms": phase,
        "call_lengths": {m: [c for model, _, c in calls if model == m] for m in MODELS},
        "steady": {"ms": {m: sum(r[f"{p}_ms"] for r in later) for m, p in zip(MODELS, ("draft", "slim", "full"))},
                   "calls": {m: sum(1 for model, k, _ in calls if model == m and k > 0) for m in MODELS},
                   "fed": {m: sum(c for model, k, c in calls if model == m and k > 0) for m in MODELS}},
        "route": trace.models.get("route"), "skipped": list(trace.models.get("skipped") or []),
        "thresholds": trace.config["thresholds"] if trace.method == "via" else None,
    }
