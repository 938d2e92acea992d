"""One round plan (via_sd.plan) for the engine and the what-if; max_unverified bounds unverified runs."""

import pytest

import viz
from via_sd import DecodeConfig, Thresholds, generate
from via_sd.plan import DRAFT, FULL, SLIM, force_verification, plan_round

PROMPTS = ["hello world", "The quick brown fox", "x = 1\ny = 2\n"]


def test_the_plan_for_the_slim_signal_sorts_everything_then_escalates_from_the_first_tier_c():
    plan = plan_round([DRAFT, SLIM, FULL, DRAFT], slim_sorts=True)
    assert plan.slim == (0, 4) and plan.full == (2, 4)
    assert plan.decide == (DRAFT, SLIM, FULL, FULL) and plan.bonus == FULL
    assert plan_round([DRAFT, DRAFT], slim_sorts=True).bonus == SLIM


def test_the_plan_for_the_draft_signal_runs_one_verifier_at_most():
    assert plan_round([DRAFT, DRAFT], slim_sorts=False) == plan_round([DRAFT, DRAFT], False)
    all_a = plan_round([DRAFT, DRAFT], slim_sorts=False)
    assert all_a.slim is None and all_a.full is None and all_a.bonus is None
    b_c = plan_round([DRAFT, SLIM, FULL, DRAFT], slim_sorts=False)  # the full pass alone decides B exactly
    assert b_c.slim is None and b_c.full == (1, 4) and b_c.decide == (DRAFT, FULL, FULL, FULL)
    b_only = plan_round([DRAFT, SLIM, DRAFT, DRAFT], slim_sorts=False)  # the slim pass up to the last B
    assert b_only.slim == (1, 2) and b_only.full is None and b_only.bonus is None
    assert plan_round([SLIM, DRAFT, SLIM], slim_sorts=False).bonus == SLIM


def test_a_forced_round_closes_tier_a_only():
    assert force_verification([DRAFT, SLIM, FULL]) == [SLIM, SLIM, FULL]


def _longest_unverified_run(trace) -> int:
    """Tier-A tokens in a row since a verifier last checked a token (a slim bonus checks nothing)."""
    run = longest = 0
    for t in trace.tokens:
        if t["tier"] == DRAFT:
            run += 1
        elif t["outcome"] != "bonus" or t["tier"] == FULL:
            run = 0
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("signal", ["slim", "draft"])
def test_max_unverified_bounds_unverified_runs_under_both_signals(tiny_routed_pair, signal):
    everything_a = Thresholds(accept=0.0, escalate=0.0, signal=signal)
    for bound in (0, 6):
        cfg = DecodeConfig(gamma=4, max_new_tokens=60, chat=False, thresholds=everything_a, max_unverified=bound)
        trace = generate(tiny_routed_pair, "hello world", "via", cfg)
        forced = [r for r in trace.rounds if r["forced_by"]]
        if bound == 0:
            assert not forced and _longest_unverified_run(trace) > 40
        else:
            assert forced and all(c["tier"] != DRAFT for r in forced for c in r["candidates"])
            assert _longest_unverified_run(trace) <= bound + cfg.gamma - 1


@pytest.mark.parametrize("signal", ["slim", "draft"])
def test_the_what_if_replays_a_real_trace_exactly_forced_rounds_included(tiny_routed_pair, signal):
    th = Thresholds(accept=0.3, escalate=0.1, signal=signal)
    forced_rounds = 0
    for prompt in PROMPTS:
        trace = generate(tiny_routed_pair, prompt, "via",
                         DecodeConfig(max_new_tokens=48, chat=False, thresholds=th, max_unverified=5))
        est = viz.what_if(trace, th)
        assert est["changed_rounds"] == 0 and est["guessed_decisions"] == 0
        assert est["tier_counts"] == trace.summary["tier_counts"]
        assert (est["full_calls"], est["slim_calls"]) == (trace.summary["full_calls"], trace.summary["slim_calls"])
        assert est["forced_rounds"] == sum(bool(r["forced_by"]) for r in trace.rounds)
        replayed = {(c["round"], c["pos"]): c["sorted_tier"] for c in est["candidates"]}
        for r in trace.rounds:
            sorted_tiers = [replayed[(r["round"], c["pos"])] for c in r["candidates"]]
            if r["forced_by"]:
                assert DRAFT not in sorted_tiers
        forced_rounds += est["forced_rounds"]
    assert forced_rounds > 0
