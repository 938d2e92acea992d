"""What if the thresholds had been different? Re-tier a recorded VIA-SD trace -- an ESTIMATE.

`what_if(trace, thresholds)` replays every recorded round over its recorded draft candidates with
other thresholds and estimates tier counts, verifier calls and time from the recorded per-phase
costs. Nothing is re-run, so the result is always labelled an estimate (`"estimate": True`,
`"label"`). With the trace's own thresholds it reproduces the recorded tier counts, full/slim
calls and rejection rate exactly.

How a round is replayed
-----------------------
1. Tiers and the round plan. Each candidate's confidence r is sorted by the engine's own tier rule
   (`via_sd.plan.tier_of`); a forced round (the run's `max_unverified` reached, counted over the
   replayed tokens as the engine counts them) closes tier A; then the engine's own round plan
   (`via_sd.plan.plan_round`) says who decides each draft and which verifier passes run.
   r comes from the recording: with the same signal, the recorded `confidence`; switching to
   signal "draft", r = `p_draft` (exact); switching a draft-signal trace to signal "slim", r =
   q'(x)/max q' is unknown, so `q_slim` (a lower bound of r) stands in where the slim verifier
   scored the token and r counts as 0 (tier C) where it did not ("approximate_confidences").
2. Decisions, walking the round in order until a replacement ends it:
   tier A -> accepted. Tier B / C -> the slim / full verifier's decision, taken from the best
   evidence the recording holds, in this order:
     a. that verifier decided this candidate in the recording          -> its decision (exact);
     b. greedy decoding and that verifier's probability of the token is > 0.5 (so it is its top
        choice), or, for the slim verifier with signal "slim", r = 1 (top) or r < 1 (not top)
                                                                        -> kept / replaced (exact);
     c. the *other* verifier decided it in the recording               -> borrow that decision;
     d. sampling, and the verifier scored the token                    -> kept iff min(1, q/p) >= 0.5;
     e. nothing is known (tier-A tokens no verifier judged, discarded drafts nobody looked at)
                                                                        -> assumed kept (optimistic).
   c-e are guesses and are counted in "guessed_decisions".
   While every decision of a round matches the recording, the round also stops where the
   recording stopped (a recorded "discarded" candidate: replacement, end of text or token budget).
3. Verifier calls and emitted tokens, as the plan says: the slim pass runs when the plan has one;
   the full pass when the plan has one and no replacement came before it. One token per reached
   candidate with the tier that decided it, plus the plan's bonus token when every draft was kept.
   A round whose replay matches the recording contributes its recorded tokens unchanged (so end of
   text and the token budget are respected).
4. Rounds are replayed independently over the *recorded* drafts: in a real run, a round that ends
   differently changes the context (and the drafts) of every later round. The estimate ignores
   that; it answers "with these thresholds, how would these drafts have been handled?".
5. Time: with the trace's cost profile (`trace.costs`, every trace since the cost model), each
   replayed pass is priced by the engine's cost model (`via_sd.costs`) for the rows it reads,
   catch-up included (each verifier's lag is followed round by round); traces without a profile
   fall back to the recorded per-phase means (drafter per candidate, slim / full per call, other
   per round). The estimated tokens/s scales the measured tokens/s by the model's speed-up over
   the recording, replayed the same way.
"""

from __future__ import annotations

from typing import Any

from via_sd.plan import Thresholds, force_verification, plan_round, tier_of

from . import palette as P
from ._trace import KEPT_DECISIONS, as_trace, is_greedy, is_number, thresholds_dict, trace_thresholds
from .tokens import token_label
from .what_if_cost import Lanes, passes_run, trace_profile

ESTIMATE_LABEL = "estimate: recorded drafts re-tiered under new thresholds (not re-run)"
TIERS = ("draft", "slim", "full")


def _confidence(c: dict, new_signal: str, rec_signal: str) -> tuple[float, bool]:
    """(r under the new signal, exact?)."""
    if new_signal == "draft" and is_number(c.get("p_draft")):
        return float(c["p_draft"]), True
    if new_signal == rec_signal and is_number(c.get("confidence")):
        return float(c["confidence"]), True
    if new_signal == "slim" and is_number(c.get("q_slim")):
        return float(c["q_slim"]), False  # q'(x) <= q'(x) / max q'
    return 0.0, False


def _decide(c: dict, tier: str, greedy: bool, rec_signal: str) -> tuple[str, bool]:
    """(decision, guessed?) for candidate `c` handled in `tier` (steps a-e of the module doc)."""
    if tier == "draft":
        return "accepted", False
    verified = c.get("decision") in ("kept", "replaced")
    if verified and c.get("tier") == tier:  # a. the same verifier decided it
        return c["decision"], False
    q = c.get("q_slim" if tier == "slim" else "q_full")
    if greedy:  # b. certain top-choice evidence
        if is_number(q) and q > 0.5:
            return "kept", False
        if tier == "slim" and rec_signal == "slim" and is_number(c.get("confidence")):
            return ("kept" if c["confidence"] >= 1.0 - 1e-9 else "replaced"), False
    if verified:  # c. borrow the other verifier's decision
        return c["decision"], True
    p = c.get("p_draft")
    if not greedy and is_number(q) and is_number(p) and p > 0:  # d. acceptance probability
        return ("kept" if min(1.0, q / p) >= 0.5 else "replaced"), True
    return "kept", True  # e. optimistic


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _skip_fraction(models: dict) -> float | None:
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


def phase_costs(trace: Any) -> dict:
    """Mean recorded cost of each phase: drafter per candidate, slim / full per call, other per round."""
    trace = as_trace(trace)
    rounds = trace.rounds
    n_cands = sum(len(r.get("candidates", [])) for r in rounds)
    slim_rounds = [r for r in rounds if r.get("slim_called", (r.get("slim_ms") or 0) > 0)]
    full_rounds = [r for r in rounds if r.get("full_called")]
    costs = {
        "draft_ms_per_candidate": (sum(r.get("draft_ms") or 0.0 for r in rounds) / n_cands) if n_cands else 0.0,
        "slim_ms_per_call": _mean([float(r.get("slim_ms") or 0.0) for r in slim_rounds]),
        "full_ms_per_call": _mean([float(r.get("full_ms") or 0.0) for r in full_rounds]),
        "other_ms_per_round": _mean([float(r.get("other_ms") or 0.0) for r in rounds]) or 0.0,
    }
    return costs


def what_if(trace: Any, thresholds: Any, costs: dict | None = None) -> dict:
    """Estimate what a VIA-SD trace would have looked like under other `thresholds`.

    `thresholds`: a `via_sd.tiers.Thresholds` or a dict {accept, escalate, signal}; a missing
    signal means the trace's own. `costs` optionally overrides `phase_costs(trace)` entries.

    Returns a dict (all counts over the recorded rounds):
      estimate (True), label, thresholds, recorded_thresholds,
      tier_counts {draft, slim, full} and label_counts of the emitted tokens, new_tokens, rounds,
      mean_accepted_length, drafted, kept_drafts, rejection_rate, full_calls, full_calls_per_token,
      slim_calls, model_ms (cost model), ms_per_token, tokens_per_s, speedup_vs_recorded,
      recorded {same keys, from the recording}, changed_rounds, guessed_decisions,
      approximate_confidences, costs, candidates [per candidate: round, pos, text, confidence,
      tier, decision, guessed, recorded_tier, recorded_decision], notes [str].
    See the module docstring for how rounds are replayed and what is guessed.
    """
    trace = as_trace(trace)
    if trace.method != "via":
        raise ValueError(f"what_if re-tiers a VIA-SD trace (method 'via'); this one is {trace.method!r}")
    rec_th = trace_thresholds(trace)
    if rec_th is None:
        raise ValueError("this VIA-SD trace does not record its thresholds (config['thresholds'])")
    new_th = dict(rec_th)
    given = thresholds_dict(thresholds if not isinstance(thresholds, dict) or "signal" in thresholds
                            else {**thresholds, "signal": rec_th["signal"]})
    new_th.update(given)
    greedy = is_greedy(trace)
    rec_signal, new_signal = rec_th["signal"], new_th["signal"]

    cost = phase_costs(trace)
    cost.update(costs or {})
    notes = []
    if cost["full_ms_per_call"] is None:
        frac = _skip_fraction(trace.models or {})
        if frac is not None and cost["slim_ms_per_call"]:
            cost["full_ms_per_call"] = cost["slim_ms_per_call"] / (1.0 - frac)
            notes.append(f"no recorded full-model call: its cost is the slim cost / (1 - {frac:.2f} skipped)")
        else:
            cost["full_ms_per_call"] = None
    if cost["slim_ms_per_call"] is None and cost["full_ms_per_call"] is not None:
        frac = _skip_fraction(trace.models or {})
        if frac is not None:
            cost["slim_ms_per_call"] = cost["full_ms_per_call"] * (1.0 - frac)
            notes.append(f"no recorded slim call: its cost is the full cost x (1 - {frac:.2f} skipped)")

    tokens_by_round: dict = {}
    for t in trace.tokens:
        tokens_by_round.setdefault(t.get("round"), []).append(t)

    tier_counts = {k: 0 for k in TIERS}
    label_counts: dict[str, int] = {}
    limit = (trace.config or {}).get("max_new_tokens")  # the run stops there, so the estimate does too
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    capped = 0  # rounds the estimate drops or cuts because the token limit was reached
    est = {"tokens": 0, "kept": 0, "full": 0, "slim": 0, "forced": 0, "ms": 0.0}
    rec = {"ms": 0.0}
    missing_cost = {"slim": False, "full": False}
    changed = guessed = approx = 0
    out_cands = []

    def round_ms(n_cands: int, slim_called: bool, full_called: bool) -> float:
        ms = n_cands * cost["draft_ms_per_candidate"] + cost["other_ms_per_round"]
        for phase, called in (("slim", slim_called), ("full", full_called)):
            if called:
                if cost[f"{phase}_ms_per_call"] is None:
                    missing_cost[phase] = True
                else:
                    ms += cost[f"{phase}_ms_per_call"]
        return ms

    rule = Thresholds(**new_th)
    slim_sorts = new_signal == "slim" and rule.fixed_tier is None
    cfg = trace.config or {}
    max_unverified = cfg.get("max_unverified") or 0
    profile = trace_profile(trace)
    prompt, opening = trace.summary.get("prompt_tokens", 0), trace.summary.get("opening_tokens", 0)
    priced = {"rec": Lanes(prompt, opening), "est": Lanes(prompt, opening)}
    unverified = 0  # as the engine counts it: tier-A tokens since a verifier last checked one
    for rnd in trace.rounds:
        cands = rnd.get("candidates", [])
        ended = False
        matches = True  # every decision so far equals the recording
        rows = []
        scored = [_confidence(c, new_signal, rec_signal) for c in cands]
        approx += sum(not exact for _, exact in scored)
        tiers = [rule.fixed_tier or tier_of(r, rule) for r, _ in scored]
        forced = bool(max_unverified) and unverified >= max_unverified
        if forced:
            tiers = force_verification(tiers, slim_sorts)
        plan = plan_round(tiers, slim_sorts)
        full_from = plan.full[0] if plan.full else len(cands)
        for k, c in enumerate(cands):
            tier = plan.decide[k]
            if ended or (matches and c.get("decision") == "discarded"):
                ended = True
                decision, was_guess = "discarded", False
            else:
                decision, was_guess = _decide(c, tier, greedy, rec_signal)
                guessed += was_guess
                if decision == "replaced":
                    ended = True
            matches = matches and decision == c.get("decision") and (decision == "discarded" or tier == c.get("tier"))
            rows.append(dict(round=rnd.get("round"), pos=c.get("pos"), text=c.get("text", ""), confidence=scored[k][0],
                             tier=tier, sorted_tier=tiers[k], decision=decision, guessed=was_guess,
                             recorded_tier=c.get("tier"), recorded_decision=c.get("decision")))
        out_cands.extend(rows)
        rec_slim = bool(rnd.get("slim_called", (rnd.get("slim_ms") or 0) > 0))
        rec_full = bool(rnd.get("full_called"))
        replaced_at = next((k for k, row in enumerate(rows) if row["decision"] == "replaced"), None)
        slim_called = plan.slim is not None and (plan.slim_sorts or replaced_at is None or replaced_at >= plan.slim[0])
        full_called = plan.full is not None and (replaced_at is None or replaced_at >= full_from)
        est["kept"] += sum(row["decision"] in KEPT_DECISIONS for row in rows)

        recorded = [(t.get("tier"), token_label(t, "via"), t.get("outcome")) for t in tokens_by_round.get(rnd.get("round"), [])]
        rec_kept = sum(c.get("decision") in KEPT_DECISIONS for c in cands)
        rec["ms"] += priced["rec"].round_ms(profile, cost, len(cands), rnd.get("gamma"), rec_slim, rec_full, rnd, rec_kept,
                                            len(recorded))
        if matches and (slim_called, full_called) == (rec_slim, rec_full):
            emitted = recorded
        else:
            changed += 1
            emitted = []
            for row in rows:
                if row["decision"] == "discarded":
                    break
                fake = {"tier": row["tier"], "outcome": "replaced" if row["decision"] == "replaced" else "kept"}
                emitted.append((row["tier"], token_label(fake, "via"), fake["outcome"]))
            if not ended and plan.bonus and (plan.bonus != "full" or full_called):
                emitted.append((plan.bonus, P.BONUS, "bonus"))
        if limit is not None and est["tokens"] + len(emitted) > limit:
            capped += 1
            emitted = emitted[:limit - est["tokens"]]
            if not emitted:  # the run would have ended before this round
                continue
        for tier, label, outcome in emitted:
            tier_counts[tier] = tier_counts.get(tier, 0) + 1
            label_counts[label] = label_counts.get(label, 0) + 1
            if outcome != "bonus" or tier == "full":  # the engine's max_unverified count
                unverified = unverified + 1 if tier == "draft" else 0
        kept_now = sum(row["decision"] in KEPT_DECISIONS for row in rows)
        est["tokens"] += len(emitted)
        est["full"] += full_called
        est["slim"] += slim_called
        est["forced"] += forced
        same = emitted is recorded and "calls" in rnd  # priced as recorded, forward by forward
        est["ms"] += priced["est"].round_ms(profile, cost, len(cands), rnd.get("gamma"), slim_called, full_called,
                                            rnd if same else passes_run(plan, full_called, slim_called), kept_now,
                                            len(emitted))

    for phase, missing in missing_cost.items():
        if missing:
            notes.append(f"no recorded cost for the {phase} verifier: its calls are counted as 0 ms")
    if guessed:
        notes.append(f"{guessed} verifier decision(s) are not in the recording and were guessed")
    if approx:
        notes.append(f"{approx} confidence(s) are approximations (signal {new_signal!r} not recorded)")
    if capped:
        notes.append(f"capped at the run's limit of {limit} new tokens ({capped} round(s) cut or dropped)")
    if changed:
        notes.append("rounds are replayed over the recorded drafts; a real run would draft differently "
                     "after a round that ends differently")

    summary = trace.summary or {}
    rec_tokens = len(trace.tokens)
    drafted = len(out_cands)
    rec_kept = sum(c.get("decision") in KEPT_DECISIONS for c in trace.candidates())
    rec_rate = rec_tokens / rec["ms"] if rec["ms"] > 0 else None
    est_rate = est["tokens"] / est["ms"] if est["ms"] > 0 else None
    speedup = est_rate / rec_rate if rec_rate and est_rate else None
    measured_tps = summary.get("tokens_per_s")
    n_rounds = len(trace.rounds)
    recorded_counts = {k: 0 for k in TIERS}
    for t in trace.tokens:
        recorded_counts[t.get("tier")] = recorded_counts.get(t.get("tier"), 0) + 1
    return {
        "estimate": True,
        "label": ESTIMATE_LABEL,
        "thresholds": new_th,
        "recorded_thresholds": rec_th,
        "tier_counts": tier_counts,
        "label_counts": label_counts,
        "new_tokens": est["tokens"],
        "rounds": n_rounds,
        "mean_accepted_length": est["tokens"] / n_rounds if n_rounds else 0.0,
        "drafted": drafted,
        "kept_drafts": est["kept"],
        "rejection_rate": 1.0 - est["kept"] / drafted if drafted else 0.0,
        "full_calls": est["full"],
        "full_calls_per_token": est["full"] / est["tokens"] if est["tokens"] else 0.0,
        "slim_calls": est["slim"],
        "forced_rounds": est["forced"],
        "model_ms": est["ms"],
        "ms_per_token": est["ms"] / est["tokens"] if est["tokens"] else None,
        "tokens_per_s": measured_tps * speedup if is_number(measured_tps) and speedup else None,
        "speedup_vs_recorded": speedup,
        "recorded": {
            "tier_counts": recorded_counts,
            "new_tokens": rec_tokens,
            "kept_drafts": rec_kept,
            "rejection_rate": 1.0 - rec_kept / drafted if drafted else 0.0,
            "full_calls": sum(bool(r.get("full_called")) for r in trace.rounds),
            "slim_calls": sum(bool(r.get("slim_called", (r.get("slim_ms") or 0) > 0)) for r in trace.rounds),
            "forced_rounds": sum(bool(r.get("forced_by")) for r in trace.rounds),
            "model_ms": rec["ms"],
            "ms_per_token": rec["ms"] / rec_tokens if rec_tokens else None,
            "tokens_per_s": measured_tps,
        },
        "changed_rounds": changed,
        "guessed_decisions": guessed,
        "approximate_confidences": approx,
        "costs": cost,
        "candidates": out_cands,
        "notes": notes,
    }
