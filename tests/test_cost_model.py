"""The cost model: a measured profile per machine and pair, the round size it picks, the run it predicts."""

import json
import logging

import pytest
import torch

from via_sd import DecodeConfig, Thresholds, Trace, generate, load_pair, tiny_random_pair
from via_sd.cost.model import (CostProfile, Rates, best_gamma, ceiling, expected_emitted, predict, predicted_tokens_per_s,
                          price_calls, roofline, scaled)
from via_sd.core.profile import _MEASURED, profile_for, profile_key, profile_path


def synthetic(V, c=0.3, s=0.8, rows=17) -> CostProfile:
    verify = tuple(100.0 * V(k) for k in range(1, rows + 1))
    return CostProfile(verify, tuple(s * v for v in verify), verify, (100.0 * c,) * 3, {}, {}, "synthetic")


CURVES = {
    "cliff at 4 rows": lambda k: 1.0 + 0.15 * (k - 1) if k <= 4 else 2.7 + 0.1 * (k - 5),
    "flat": lambda k: 1.0,
    "linear": lambda k: float(k),
}


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("alpha", [0.5, 0.78, 0.95])
@pytest.mark.parametrize("c", [0.05, 0.3])
def test_auto_gamma_is_the_argmax_of_the_ceiling_formula(curve, alpha, c):
    profile = synthetic(CURVES[curve], c=c)
    rates = Rates(kept=alpha * 1e4, trials=1e4)

    def speedup(g):  # SD / AR = E / (g c + V(g + 1)), written out again here
        return (1 - alpha ** (g + 1)) / (1 - alpha) / (g * c + CURVES[curve](g + 1))

    want = max(range(1, 17), key=lambda g: (speedup(g), -g))
    assert best_gamma(profile, "sd", rates) == want
    assert ceiling(profile, alpha, want) == pytest.approx(speedup(want))


def test_auto_gamma_keeps_rounds_below_the_cliff_and_grows_when_verification_is_flat():
    rates = Rates(kept=7800, trials=10000)
    assert best_gamma(synthetic(CURVES["cliff at 4 rows"], c=0.1), "sd", rates) == 3  # 4 rows: the last cheap block
    assert best_gamma(synthetic(CURVES["flat"], c=0.02), "sd", Rates(kept=9500, trials=10000)) >= 10
    assert best_gamma(synthetic(CURVES["linear"], c=0.42), "sd", rates) == 1


def test_expected_emitted_counts_the_bonus_token():
    assert expected_emitted(0.0, 5) == pytest.approx(1.0)
    assert expected_emitted(0.5, 1) == pytest.approx(1.5)
    assert expected_emitted(0.78, 3) == pytest.approx(1 + 0.78 + 0.78**2 + 0.78**3)


def test_via_prices_its_tiers_a_round_never_escalating_costs_only_the_slim_pass():
    p = synthetic(CURVES["linear"], s=0.5)
    never = Rates(to_full=0, sorted=100)
    always = Rates(to_full=100, sorted=100)
    from via_sd.cost.model import via_round_ms
    assert via_round_ms(p, 3, never, slim_sorts=True) == pytest.approx(3 * 30 + 0.5 * 400)
    assert via_round_ms(p, 3, always, slim_sorts=True) == pytest.approx(3 * 30 + 0.5 * 400 + 400)
    assert via_round_ms(p, 3, Rates(to_full=0, to_slim=0, sorted=100), slim_sorts=False) == pytest.approx(90)


def test_a_real_run_records_its_gamma_and_every_forward(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path))
    for method in ("sd", "via"):
        trace = generate(tiny_pair, "hello world", method, DecodeConfig(max_new_tokens=24, chat=False))
        assert trace.config["gamma"] == "auto"
        # the round that reads the prompt decides one token, as AR's first step does (its drafts would need a pass
        # of their own: the prompt is read in a call apart); drafting starts with the next round
        # (in SD; the tiers decide VIA-SD's first round)
        first, drafting = trace.rounds[0], trace.rounds[1:] if method == "sd" else trace.rounds
        if method == "sd":
            assert first["gamma"] == 0 and first["drafter"] is None and not first["candidates"]
            assert [(c["model"], c["prompt"]) for c in first["calls"]] == [("full", True)]
            assert sum(t["round"] == 0 for t in trace.tokens) == 1
        assert drafting and all(1 <= r["gamma"] <= 16 for r in drafting)
        assert all(len(r["candidates"]) <= r["gamma"] for r in trace.rounds)
        drafter_rows = sum(c["rows"] for r in trace.rounds for c in r["calls"] if c["model"] == "drafter")
        assert drafter_rows >= sum(len(r["candidates"]) for r in trace.rounds) - 1
        assert trace.costs == tiny_pair.costs.to_dict()
        assert trace.summary["predicted_tokens_per_s"] > 0  # priced round by round, equal to pricing the whole trace
        assert trace.summary["predicted_tokens_per_s"] == pytest.approx(
            predicted_tokens_per_s(tiny_pair.costs, trace.rounds, trace.summary["new_tokens"]))
        assert Trace.from_json(trace.to_json()) == trace
    fixed = generate(tiny_pair, "hello world", "sd", DecodeConfig(gamma=2, max_new_tokens=12, chat=False))
    assert {r["gamma"] for r in fixed.rounds} <= {1, 2} and fixed.rounds[0]["gamma"] == 2


def test_ar_reads_the_prompt_once_then_one_row_a_token(tiny_pair):
    trace = generate(tiny_pair, "hello world", "ar", DecodeConfig(max_new_tokens=8, chat=False))
    calls = [c for r in trace.rounds for c in r["calls"]]
    assert calls[0]["ms"] > 0 and all(c["ms"] > 0 for c in calls)  # each forward's own time, for the profile
    assert {k: v for k, v in calls[0].items() if k != "ms"} == {"model": "full", "rows": trace.summary["prompt_tokens"],
                                                                "past": 0, "resume": False, "prompt": True}
    assert [c["rows"] for c in calls[1:]] == [1] * 7 and not any(c["prompt"] for c in calls[1:])


def test_predicted_speed_prices_each_recorded_forward():
    p = synthetic(CURVES["linear"], c=0.5)
    rounds = [{"calls": [{"model": "full", "rows": 3, "past": 10}, {"model": "drafter", "rows": 1, "past": 10}]}]
    assert price_calls(p, rounds) == pytest.approx(300 + 50)
    assert price_calls(p, [{"candidates": []}]) is None  # a trace from before calls were recorded
    after_opening = [{"calls": [{"model": "full", "rows": 30, "past": 24, "prompt": True}]}]
    assert price_calls(p, after_opening) == pytest.approx(p.prompt("full", 30))  # read as a prompt, not verify(30)
    ar = {"rounds": [{"calls": [{"model": "full", "rows": 1, "past": 5}]}] * 4, "summary": {"new_tokens": 4}}
    sd = {"rounds": [{"calls": [{"model": "drafter", "rows": 1, "past": 5}] * 3 +
                      [{"model": "full", "rows": 4, "past": 5}]}], "summary": {"new_tokens": 4}}
    out = predict(p, {"ar": ar, "sd": sd})
    assert out["speedup"]["sd_vs_ar"] == pytest.approx(400 / (150 + 400))
    flat = scaled(p, flatness=1.0)
    assert predict(flat, {"ar": ar, "sd": sd})["speedup"]["sd_vs_ar"] == pytest.approx(400 / 250)


def test_projections_keep_their_label_and_a_gpu_roofline_is_flat():
    gpu = roofline("A10G", drafter_bytes=10**9, verifier_bytes=14 * 10**9, slim_fraction=0.6)
    assert gpu.V(8) == pytest.approx(1.0) and 0 < gpu.c < 0.2
    assert "projection" in gpu.source and "projection" in scaled(gpu, c=0.1).source
    with pytest.raises(ValueError, match="A10G"):
        roofline("GTX", 1, 1, 0.5)


@pytest.mark.parametrize("gamma", ["fast", 0, 65, 2.5, True, None])
def test_gamma_must_be_auto_or_a_whole_number_in_range(gamma):
    with pytest.raises(ValueError, match="auto"):
        DecodeConfig(gamma=gamma)


def test_the_profile_is_cached_per_setting_and_a_bad_file_is_measured_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path))
    pair = tiny_random_pair(seed=0)
    first = profile_for(pair)
    path = profile_path(first.key)
    _MEASURED.clear()  # as a new process: the file is read back, not measured again
    assert path.exists() and profile_for(pair) == first
    assert CostProfile.from_dict(json.loads(path.read_text())) == first

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert profile_key(pair) != first.key and profile_path(profile_key(pair)) != path
        assert profile_for(pair).key["threads"] == threads + 1
    finally:
        torch.set_num_threads(threads)
    pair.weights = "bf16"  # another weights setting is another profile
    assert profile_for(pair).key["weights"] == "bf16"
    pair.weights = "fp32"

    for bad in ("{not json", json.dumps({**first.to_dict(), "key": {**first.key, "threads": 999}}),
                json.dumps({"verify_ms": [-1]})):
        path.write_text(bad)
        _MEASURED.clear()  # as a new process
        with caplog.at_level(logging.WARNING, logger="via_sd.core.profile"):
            caplog.clear()
            again = profile_for(pair)
        assert again.key == first.key and len(caplog.records) == 1
        assert "measuring again" in caplog.records[0].getMessage()
        assert CostProfile.from_dict(json.loads(path.read_text())).key == first.key  # the bad file was replaced


def test_copies_of_a_pair_with_a_read_only_cache_measure_its_profile_once(tmp_path, monkeypatch):
    """A Space's cache can be read-only: the app's per-run copies (dataclasses.replace, which drop the lazily read
    profile) must not measure it again each run."""
    import dataclasses

    from via_sd.core import profile

    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "missing"))
    (tmp_path / "missing").write_text("a file, so no folder can be made here")
    measured = []
    monkeypatch.setattr(profile, "measure", lambda pair, key, progress=None: measured.append(key) or CostProfile(
        (10.0,) * 17, (9.0,) * 17, (8.0,) * 17, (3.0,) * 3, key=key))
    pair = load_pair("random")
    first = pair.costs
    assert dataclasses.replace(pair).costs is first and measured == [first.key]


def test_thresholds_that_send_everything_to_tier_c_pick_rounds_as_sd_does(tiny_pair):
    lossless = DecodeConfig(max_new_tokens=24, chat=False, thresholds=Thresholds.preset("lossless"))
    sd, via = generate(tiny_pair, "hello", "sd", lossless), generate(tiny_pair, "hello", "via", lossless)
    assert via.token_ids == sd.token_ids


def test_acceptance_counts_drafts_tried_before_the_first_rejection():
    from via_sd.cost.model import acceptance

    rounds = [{"candidates": [{"decision": "kept"}, {"decision": "kept"}, {"decision": "replaced"},
                              {"decision": "discarded"}]},  # 2 kept of 3 tried: the discarded one never was
              {"candidates": [{"decision": "accepted"}, {"decision": "kept"}]}]
    assert acceptance(rounds) == pytest.approx(4 / 5)
    assert acceptance([{"candidates": []}]) is None and acceptance([]) is None


def _steps_profile() -> CostProfile:
    """A profile whose every row count has its own price, so a test can read off which k a round was priced at."""
    return CostProfile(tuple(10.0 + k for k in range(17)), tuple(9.0 + k for k in range(17)),
                       tuple(8.0 + k for k in range(17)), (3.0, 3.5, 4.0))


def test_a_full_pass_is_priced_over_the_drafts_and_the_bonus_token_it_lags_by_not_twice():
    """After a round, the bonus token is the one position no verifier has read: the next full pass reads it and
    the gamma drafts, gamma + 1 rows (plain SD's V(gamma + 1)); the pending token is not counted again."""
    from via_sd.cost.model import via_round_ms

    profile, rates = _steps_profile(), Rates()
    rates.to_full = rates.sorted  # every draft to tier C: every round runs the full pass
    for lag in (0, 1, 1, 1):
        rates.add(0, False, [], lag=lag)
    assert rates.lag < 1 and via_round_ms(profile, 3, rates, slim_sorts=False) == 3 * 3.0 + profile.verify(4)
    rates.lag = 3.0  # three tokens behind (rounds that skipped the full verifier): they are read too
    assert via_round_ms(profile, 3, rates, slim_sorts=False) == 3 * 3.0 + profile.verify(6)


def test_round_zero_teaches_no_lag_from_the_prompt_which_is_read_in_a_call_of_its_own(tiny_pair, monkeypatch):
    """The full verifier reads the prompt in a call of its own, priced as a prompt read; the lag a round teaches
    gamma="auto" counts only the positions past the prompt it catches up on with the drafts."""
    learned = []
    add = Rates.add
    monkeypatch.setattr(Rates, "add", lambda self, kept, rejected, tiers, lag=None:
                        learned.append(lag) or add(self, kept, rejected, tiers, lag))
    everything_to_full = Thresholds(accept=1.0, escalate=1.0, signal="draft")
    trace = generate(tiny_pair, "a longer prompt than one token", "via",
                     DecodeConfig(gamma=3, max_new_tokens=12, chat=False, thresholds=everything_to_full))
    assert learned[0] == 0 and set(learned[1:]) == {1}
    full = [[c for c in r["calls"] if c["model"] == "full" and not c["prompt"]] for r in trace.rounds]
    assert [c[0]["rows"] for c in full] == [r["gamma"] + min(k, 1) for k, r in enumerate(trace.rounds)]


def test_a_round_all_in_tier_a_is_priced_without_the_bonus_token_it_does_not_emit():
    from via_sd.cost.model import via_round_ms, via_round_tokens

    profile, rates = _steps_profile(), Rates()  # the prior: nothing escalates, nothing goes to tier B
    assert via_round_tokens(4, rates, slim_sorts=False) == 4  # no verifier ran: the four drafts, no bonus
    assert via_round_ms(profile, 4, rates, slim_sorts=False) == 4 * 3.0
    assert via_round_tokens(4, rates, slim_sorts=True) == pytest.approx(expected_emitted(rates.alpha, 4))
