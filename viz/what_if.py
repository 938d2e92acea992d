"""What if the thresholds had been different? Re-tier a recorded VIA-SD trace -- an ESTIMATE.

`what_if(trace, thresholds)` replays every recorded round over its recorded draft candidates with
other thresholds and estimates tier counts, verifier calls and time from the recorded per-phase
costs: `replay_round` replays one round and returns what it contributed (a `RoundReplay`), and
`what_if` adds the rounds up. Nothing is re-run, so the result is always labelled an estimate (`"estimate": True`,
`"label"`). With the trace's own thresholds it reproduces the recorded tier counts, full/slim
calls and rejection rate exactly.

How a round is replayed
-----------------------
1. Tiers and the round plan. Each candidate's confidence r is sorted by the engine's own tier rule
   (`via_sd.core.plan.sort_tiers`); a forced round (the run's `max_unverified` reached, counted over the
   replayed tokens as the engine counts them) closes tier A; then the engine's own round plan
   (`via_sd.core.plan.plan_round`) says who decides each draft and which verifier passes run.
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
   replayed pass is priced by the engine's cost model (`via_sd.cost.model`) for the rows it reads,
   catch-up included (each verifier's lag is followed round by round); traces without a profile
   fall back to the recorded per-phase means (drafter per candidate, slim / full per call, other
   per round). The estimated tokens/s scales the measured tokens/s by the model's speed-up over
   the recording, replayed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from via_sd.core.plan import (DRAFT, FULL, SLIM, TIERS, Thresholds, plan_round, slim_sorts, sort_tiers,
                               unverified_run)

from . import palette as P
from ._trace import KEPT_DECISIONS, as_trace, is_greedy, is_number, thresholds_dict, trace_thresholds
from .tokens import token_label
from .what_if_cost import Lanes, passes_run, phase_costs, skip_fraction, ran_slim_pass, trace_profile

ESTIMATE_LABEL = "estimate: recorded drafts re-tiered under new thresholds (not re-run)"


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
    if tier == DRAFT:
        return "accepted", False
    verified = c.get("decision") in ("kept", "replaced")
    if verified and c.get("tier") == tier:  # a. the same verifier decided it
        return c["decision"], False
    q = c.get("q_slim" if tier == SLIM else "q_full")
    if greedy:  # b. certain top-choice evidence
        if is_number(q) and q > 0.5:
            return "kept", False
        if tier == SLIM and rec_signal == "slim" and is_number(c.get("confidence")):
            return ("kept" if c["confidence"] >= 1.0 - 1e-9 else "replaced"), False
    if verified:  # c. borrow the other verifier's decision
        return c["decision"], True
    p = c.get("p_draft")
    if not greedy and is_number(q) and is_number(p) and p > 0:  # d. acceptance probability
        return ("kept" if min(1.0, q / p) >= 0.5 else "replaced"), True
    return "kept", True  # e. optimistic


@dataclass
class RoundReplay:
    """What one recorded round contributes to the estimate once replayed under the new thresholds."""

    candidates: list[dict]  # one row per recorded draft: its new tier and decision next to the recorded ones
    emitted: list[tuple]  # (tier, label, outcome) of every token the round emits, within the run's token limit
    kept: int  # drafts accepted or kept
    slim_called: bool
    full_called: bool
    forced: bool  # tier A closed by the run's max_unverified
    changed: bool  # ends differently from the recording
    capped: bool  # cut or dropped by the run's token limit
    guessed: int  # verifier decisions the recording does not hold
    approximate: int  # confidences the recording does not hold exactly
    model_ms: float  # the replayed passes, priced
    recorded_ms: float  # the recorded passes, priced the same way


@dataclass
class Replay:
    """What every round of one replay shares, and what it carries from round to round."""

    rule: Thresholds
    greedy: bool
    rec_signal: str
    max_unverified: int
    limit: int | None  # the run's max_new_tokens: the run stops there, so the estimate does too
    profile: Any
    cost: dict
    tokens_by_round: dict
    lanes: dict  # "rec" / "est": each model's cache, followed round by round
    unverified: int = 0  # as the engine counts it: tier-A tokens since a verifier last checked one
    new_tokens: int = 0  # emitted by the rounds replayed so far

    @property
    def slim_sorts(self) -> bool:
        return slim_sorts("via", self.rule)


def _thresholds(trace, thresholds: Any) -> tuple[dict, dict]:
    """(recorded, new) thresholds; new ones given without a signal keep the recording's."""
    rec_th = trace_thresholds(trace)
    if rec_th is None:
        raise ValueError("this VIA-SD trace does not record its thresholds (config['thresholds'])")
    new_th = dict(rec_th)
    new_th.update(thresholds_dict(thresholds if not isinstance(thresholds, dict) or "signal" in thresholds
                                  else {**thresholds, "signal": rec_th["signal"]}))
    return rec_th, new_th


def _priced_costs(trace, costs: dict | None) -> tuple[dict, list[str]]:
    """The recorded per-phase means (and their notes); a verifier that never ran is priced from the other one."""
    cost = phase_costs(trace)
    cost.update(costs or {})
    notes = []
    if cost["full_ms_per_call"] is None:
        frac = skip_fraction(trace.models or {})
        if frac is not None and cost["slim_ms_per_call"]:
            cost["full_ms_per_call"] = cost["slim_ms_per_call"] / (1.0 - frac)
            notes.append(f"no recorded full-model call: its cost is the slim cost / (1 - {frac:.2f} skipped)")
    if cost["slim_ms_per_call"] is None and cost["full_ms_per_call"] is not None:
        frac = skip_fraction(trace.models or {})
        if frac is not None:
            cost["slim_ms_per_call"] = cost["full_ms_per_call"] * (1.0 - frac)
            notes.append(f"no recorded slim call: its cost is the full cost x (1 - {frac:.2f} skipped)")
    return cost, notes


def _replay_context(trace, new_th: dict, rec_signal: str, cost: dict) -> Replay:
    """The rule, the run's limits and the pricing every round of the replay shares."""
    cfg = trace.config or {}
    limit = cfg.get("max_new_tokens")
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    tokens_by_round: dict = {}
    for t in trace.tokens:
        tokens_by_round.setdefault(t.get("round"), []).append(t)
    prompt, opening = trace.summary.get("prompt_tokens", 0), trace.summary.get("opening_tokens", 0)
    return Replay(rule=Thresholds(**new_th), greedy=is_greedy(trace), rec_signal=rec_signal,
                   max_unverified=cfg.get("max_unverified") or 0, limit=limit, profile=trace_profile(trace),
                   cost=cost, tokens_by_round=tokens_by_round,
                   lanes={"rec": Lanes(prompt, opening), "est": Lanes(prompt, opening)})


def _decide_round(ctx: Replay, rnd: dict, scored: list, tiers: list, plan) -> tuple[list[dict], bool, bool, int]:
    """Step 2, the round's drafts in order: (rows, ended, still matches the recording, guesses)."""
    rows, ended, matches, guessed = [], False, True, 0
    for k, c in enumerate(rnd.get("candidates", [])):
        tier = plan.decide[k]
        if ended or (matches and c.get("decision") == "discarded"):
            ended = True
            decision, was_guess = "discarded", False
        else:
            decision, was_guess = _decide(c, tier, ctx.greedy, ctx.rec_signal)
            guessed += was_guess
            if decision == "replaced":
                ended = True
        matches = matches and decision == c.get("decision") and (decision == "discarded" or tier == c.get("tier"))
        rows.append(dict(round=rnd.get("round"), pos=c.get("pos"), text=c.get("text", ""), confidence=scored[k][0],
                         tier=tier, sorted_tier=tiers[k], decision=decision, guessed=was_guess,
                         recorded_tier=c.get("tier"), recorded_decision=c.get("decision")))
    return rows, ended, matches, guessed


def _calls_made(plan, rows: list[dict]) -> tuple[bool, bool]:
    """Step 3, (slim, full): a pass runs when the plan has one and no replacement came before it."""
    replaced_at = next((k for k, row in enumerate(rows) if row["decision"] == "replaced"), None)
    slim = plan.slim is not None and (plan.slim_sorts or replaced_at is None or replaced_at >= plan.slim[0])
    full = plan.full is not None and (replaced_at is None or replaced_at >= plan.full[0])
    return slim, full


def _replayed_tokens(rows: list[dict], plan, ended: bool, full_called: bool) -> list[tuple]:
    """A round that ends differently emits one token per reached draft, plus the plan's bonus when none was replaced."""
    emitted = []
    for row in rows:
        if row["decision"] == "discarded":
            break
        fake = {"tier": row["tier"], "outcome": "replaced" if row["decision"] == "replaced" else "kept"}
        emitted.append((row["tier"], token_label(fake, "via"), fake["outcome"]))
    if not ended and plan.bonus and (plan.bonus != FULL or full_called):
        emitted.append((plan.bonus, P.BONUS, "bonus"))
    return emitted


def replay_round(ctx: Replay, rnd: dict) -> RoundReplay:
    """One recorded round under the new thresholds (steps 1-5 of the module doc); advances `ctx` past it."""
    cands = rnd.get("candidates", [])
    scored = [_confidence(c, ctx.rule.signal, ctx.rec_signal) for c in cands]
    forced = bool(ctx.max_unverified) and ctx.unverified >= ctx.max_unverified
    tiers = sort_tiers([r for r, _ in scored], ctx.rule, forced, ctx.slim_sorts)
    plan = plan_round(tiers, ctx.slim_sorts)
    rows, ended, matches, guessed = _decide_round(ctx, rnd, scored, tiers, plan)
    slim_called, full_called = _calls_made(plan, rows)
    kept = sum(row["decision"] in KEPT_DECISIONS for row in rows)
    rec_calls = (ran_slim_pass(rnd), bool(rnd.get("full_called")))
    recorded = [(t.get("tier"), token_label(t, "via"), t.get("outcome"))
                for t in ctx.tokens_by_round.get(rnd.get("round"), [])]
    rec_kept = sum(c.get("decision") in KEPT_DECISIONS for c in cands)
    recorded_ms = ctx.lanes["rec"].round_ms(ctx.profile, ctx.cost, len(cands), rnd.get("gamma"), *rec_calls, rnd,
                                            rec_kept, len(recorded))
    changed = not (matches and (slim_called, full_called) == rec_calls)
    emitted = _replayed_tokens(rows, plan, ended, full_called) if changed else recorded
    capped = ctx.limit is not None and ctx.new_tokens + len(emitted) > ctx.limit
    if capped:
        emitted = emitted[:ctx.limit - ctx.new_tokens]
    replay = RoundReplay(rows, emitted, kept, slim_called, full_called, forced, changed, capped, guessed,
                         sum(not exact for _, exact in scored), model_ms=0.0, recorded_ms=recorded_ms)
    if capped and not emitted:  # the run would have ended before this round
        replay.slim_called = replay.full_called = replay.forced = False
        return replay
    ctx.unverified = unverified_run(ctx.unverified, [(tier, outcome) for tier, _, outcome in emitted])
    ctx.new_tokens += len(emitted)
    as_recorded = not changed and not capped and "calls" in rnd  # priced as recorded, forward by forward
    passes = rnd if as_recorded else passes_run(plan, full_called, slim_called)
    replay.model_ms = ctx.lanes["est"].round_ms(ctx.profile, ctx.cost, len(cands), rnd.get("gamma"), slim_called,
                                                full_called, passes, kept, len(emitted))
    return replay


def _recorded(trace, model_ms: float, drafted: int) -> dict:
    """The estimate's numbers as the recording has them, to compare against."""
    tokens = len(trace.tokens)
    kept = sum(c.get("decision") in KEPT_DECISIONS for c in trace.candidates())
    tier_counts = dict.fromkeys(TIERS, 0)
    for t in trace.tokens:
        tier_counts[t.get("tier")] = tier_counts.get(t.get("tier"), 0) + 1
    return {
        "tier_counts": tier_counts,
        "new_tokens": tokens,
        "kept_drafts": kept,
        "rejection_rate": 1.0 - kept / drafted if drafted else 0.0,
        "full_calls": sum(bool(r.get("full_called")) for r in trace.rounds),
        "slim_calls": sum(ran_slim_pass(r) for r in trace.rounds),
        "forced_rounds": sum(bool(r.get("forced_by")) for r in trace.rounds),
        "model_ms": model_ms,
        "ms_per_token": model_ms / tokens if tokens else None,
        "tokens_per_s": (trace.summary or {}).get("tokens_per_s"),
    }


def _notes(notes: list[str], replays: list[RoundReplay], signal: str, limit: int | None) -> list[str]:
    """What the estimate could not know, in words."""
    guessed, approx = sum(r.guessed for r in replays), sum(r.approximate for r in replays)
    capped, changed = sum(r.capped for r in replays), sum(r.changed for r in replays)
    if guessed:
        notes.append(f"{guessed} verifier decision(s) are not in the recording and were guessed")
    if approx:
        notes.append(f"{approx} confidence(s) are approximations (signal {signal!r} not recorded)")
    if capped:
        notes.append(f"capped at the run's limit of {limit} new tokens ({capped} round(s) cut or dropped)")
    if changed:
        notes.append("rounds are replayed over the recorded drafts; a real run would draft differently "
                     "after a round that ends differently")
    return notes


def _summary(trace, replays: list[RoundReplay], rec_th: dict, new_th: dict, cost: dict, notes: list[str],
             limit: int | None) -> dict:
    """The replayed rounds added up, next to the same numbers from the recording."""
    tier_counts, label_counts = dict.fromkeys(TIERS, 0), {}
    for tier, label, _ in (token for r in replays for token in r.emitted):
        tier_counts[tier] = tier_counts.get(tier, 0) + 1
        label_counts[label] = label_counts.get(label, 0) + 1
    candidates = [row for r in replays for row in r.candidates]
    tokens, drafted, kept = sum(len(r.emitted) for r in replays), len(candidates), sum(r.kept for r in replays)
    full, ms = sum(r.full_called for r in replays), sum((r.model_ms for r in replays), 0.0)
    recorded = _recorded(trace, sum((r.recorded_ms for r in replays), 0.0), drafted)
    rec_rate = recorded["new_tokens"] / recorded["model_ms"] if recorded["model_ms"] > 0 else None
    est_rate = tokens / ms if ms > 0 else None
    speedup = est_rate / rec_rate if rec_rate and est_rate else None
    measured_tps = recorded["tokens_per_s"]
    n_rounds = len(trace.rounds)
    notes = _notes(notes, replays, new_th["signal"], limit)
    return {
        "estimate": True,
        "label": ESTIMATE_LABEL,
        "thresholds": new_th,
        "recorded_thresholds": rec_th,
        "tier_counts": tier_counts,
        "label_counts": label_counts,
        "new_tokens": tokens,
        "rounds": n_rounds,
        "mean_accepted_length": tokens / n_rounds if n_rounds else 0.0,
        "drafted": drafted,
        "kept_drafts": kept,
        "rejection_rate": 1.0 - kept / drafted if drafted else 0.0,
        "full_calls": full,
        "full_calls_per_token": full / tokens if tokens else 0.0,
        "slim_calls": sum(r.slim_called for r in replays),
        "forced_rounds": sum(r.forced for r in replays),
        "model_ms": ms,
        "ms_per_token": ms / tokens if tokens else None,
        "tokens_per_s": measured_tps * speedup if is_number(measured_tps) and speedup else None,
        "speedup_vs_recorded": speedup,
        "recorded": recorded,
        "changed_rounds": sum(r.changed for r in replays),
        "guessed_decisions": sum(r.guessed for r in replays),
        "approximate_confidences": sum(r.approximate for r in replays),
        "costs": cost,
        "candidates": candidates,
        "notes": notes,
    }


def what_if(trace: Any, thresholds: Any, costs: dict | None = None) -> dict:
    """Estimate what a VIA-SD trace would have looked like under other `thresholds`.

    `thresholds`: a `via_sd.core.plan.Thresholds` or a dict {accept, escalate, signal}; a missing
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
    rec_th, new_th = _thresholds(trace, thresholds)
    cost, notes = _priced_costs(trace, costs)
    ctx = _replay_context(trace, new_th, rec_th["signal"], cost)
    replays = [replay_round(ctx, rnd) for rnd in trace.rounds]
    return _summary(trace, replays, rec_th, new_th, cost, notes, ctx.limit)
