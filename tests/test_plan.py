"""One round plan (via_sd.core.plan) for the engine and the what-if; max_unverified bounds unverified runs."""

import pytest

import viz
from via_sd import DecodeConfig, Thresholds, generate
from via_sd.core.plan import DRAFT, FULL, SLIM, force_verification, plan_round, unverified_run

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
    assert force_verification([DRAFT, SLIM, FULL], slim_sorts=True) == [SLIM, SLIM, FULL]  # the slim pass ran
    assert force_verification([DRAFT, SLIM, FULL], slim_sorts=False) == [FULL, SLIM, FULL]  # no slim pass to redo


def _longest_unverified_run(trace) -> int:
    """The longest run of tokens kept with no verifier, counted as the engine counts it (plan.unverified_run)."""
    run = longest = 0
    for t in trace.tokens:
        run = unverified_run(run, [(t["tier"], t["outcome"])])
        longest = max(longest, run)
    return longest


def test_an_unverified_run_grows_with_tier_a_and_ends_at_a_verified_token_not_at_a_slim_bonus():
    assert unverified_run(0, [(DRAFT, "kept")] * 3) == 3
    assert unverified_run(3, [(SLIM, "bonus")]) == 3  # a slim bonus checks nothing
    assert unverified_run(3, [(FULL, "bonus")]) == 0 and unverified_run(3, [(SLIM, "kept"), (DRAFT, "kept")]) == 1


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
            checked_by = {c["tier"] for r in forced for c in r["candidates"] if c["decision"] != "discarded"}
            assert checked_by == {FULL}  # no slim pass sorted them (accept 0 needs no signal): the full verifier
            assert _longest_unverified_run(trace) <= bound + cfg.gamma - 1


def test_a_forced_round_goes_to_the_slim_verifier_only_when_its_pass_sorted_the_drafts(tiny_routed_pair):
    nearly_all_a = Thresholds(accept=1e-9, escalate=0.0, signal="slim")  # the slim pass runs, every draft is A
    cfg = DecodeConfig(gamma=4, max_new_tokens=40, chat=False, thresholds=nearly_all_a, max_unverified=6)
    forced = [r for r in generate(tiny_routed_pair, "hello world", "via", cfg).rounds if r["forced_by"]]
    assert forced and all(r["slim_called"] and not r["full_called"] for r in forced)
    assert {c["tier"] for r in forced for c in r["candidates"] if c["decision"] != "discarded"} == {SLIM}


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


def _rows_per_sublayer(pair, prompt: str, config) -> tuple[dict, int]:
    """Rows of each verifier sub-layer's inputs during VIA-SD's round 1, and the prompt's length."""
    from via_sd.core.decoding import stream_events

    rows, hooks = {}, []
    for i, layer in enumerate(pair.verifier.model.layers):
        for kind, module in (("attn", layer.self_attn), ("mlp", layer.mlp)):
            def count(_, args, kwargs, key=f"{kind}.{i}"):
                h = args[0] if args else kwargs["hidden_states"]
                rows[key] = rows.get(key, 0) + h.shape[1]
            hooks.append(module.register_forward_pre_hook(count, with_kwargs=True))
    try:
        events = stream_events(pair, prompt, "via", config)
        first = next(e for e in events if e.kind == "round")
    finally:
        for h in hooks:
            h.remove()
    return rows, first.trace.summary["prompt_tokens"], first.trace.rounds[0]


def test_round_one_reads_the_prompt_once_in_the_shared_layers_and_once_more_per_design(tiny_routed_pair):
    """slim_cache="own": the shared sub-layers read the prompt once, the slim and the full verifier each once more
    after the split. "full": the full verifier reads the prompt once for both (the slim one reads its cache)."""
    pair, prompt = tiny_routed_pair, "The quick brown fox jumps"
    escalate = Thresholds(accept=1.0, escalate=0.999, signal="slim")  # the slim pass sorts, then the full pass runs
    split = pair.slim.first_skip
    for slim_cache in ("own", "full"):
        cfg = DecodeConfig(gamma=4, max_new_tokens=5, chat=False, thresholds=escalate, slim_cache=slim_cache)
        rows, L, rnd = _rows_per_sublayer(pair, prompt, cfg)
        assert rnd["slim_called"] and rnd["full_called"]
        n = len(rnd["candidates"])
        for k in range(pair.slim.sublayers):
            name = f"{'mlp' if k % 2 else 'attn'}.{k // 2}"
            skipped = pair.slim.skipped[k]
            if k < split:  # the shared trunk: every position once (prompt, then the drafts)
                assert rows[name] == L + n, (slim_cache, name)
            elif slim_cache == "own":  # the slim view reads the prompt, then the full view reads it again
                assert rows[name] == (0 if skipped else L + n) + L + n, (slim_cache, name)
            else:  # the full view reads the prompt but its last token once; the slim view from there
                assert rows[name] == (0 if skipped else 1 + n) + (L - 1) + (1 + n), (slim_cache, name)


def test_a_slim_verifier_reading_the_full_cache_changes_nothing_where_it_never_runs(tiny_routed_pair):
    for th in (Thresholds.preset("lossless"), Thresholds(accept=0.5, escalate=0.5, signal="draft")):
        runs = {cache: generate(tiny_routed_pair, "hello world", "via",
                                DecodeConfig(gamma=4, max_new_tokens=40, chat=False, thresholds=th, slim_cache=cache))
                for cache in ("own", "full")}
        assert runs["own"].token_ids == runs["full"].token_ids
    sd = generate(tiny_routed_pair, "hello world", "sd", DecodeConfig(gamma=4, max_new_tokens=40, chat=False))
    assert runs["own"].token_ids != [] and generate(
        tiny_routed_pair, "hello world", "via",
        DecodeConfig(gamma=4, max_new_tokens=40, chat=False, thresholds=Thresholds.preset("lossless"))).token_ids == sd.token_ids
