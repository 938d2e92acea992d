"""Decoding mechanics on tiny random models: losslessness of SD, VIA's tiers, streaming, stopping."""

import threading

import pytest

from via_sd import DecodeConfig, Thresholds, generate, stream, tiny_random_pair

PROMPTS = ["hello world", "The quick brown fox", "x = 1\ny = 2\n", "a"]


def config(**kw):
    kw.setdefault("max_new_tokens", 32)
    kw.setdefault("chat", False)
    return DecodeConfig(**kw)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_matches_autoregressive(tiny_pair, gamma):
    for prompt in PROMPTS:
        ar = generate(tiny_pair, prompt, "ar", config(gamma=gamma))
        sd = generate(tiny_pair, prompt, "sd", config(gamma=gamma))
        assert sd.token_ids == ar.token_ids
        assert sd.text == ar.text
        assert sd.summary["mean_accepted_length"] > 1.0  # drafts were really kept, not only corrected


def test_greedy_ar_matches_transformers_generate(tiny_pair):
    for prompt in PROMPTS:
        ids = tiny_pair.tokenizer(prompt, return_tensors="pt").input_ids
        hf = tiny_pair.verifier.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
        assert generate(tiny_pair, prompt, "ar", config()).token_ids == hf


def test_seeded_sampling_is_repeatable(tiny_pair):
    cfg = config(temperature=1.0, top_p=0.9, seed=7)
    for method in ("ar", "sd", "via"):
        assert generate(tiny_pair, "hello", method, cfg).token_ids == generate(tiny_pair, "hello", method, cfg).token_ids
    other = config(temperature=1.0, top_p=0.9, seed=8)
    assert generate(tiny_pair, "hello", "sd", cfg).token_ids != generate(tiny_pair, "hello", "sd", other).token_ids


def test_via_with_route_none_equals_autoregressive_under_greedy(tiny_pair):
    """With nothing skipped the slim verifier is the full one; accept=1 admits only its top choice."""
    assert tiny_pair.route.name == "none"
    for escalate in (0.0, 0.3, 1.0):
        cfg = config(thresholds=Thresholds(accept=1.0, escalate=escalate, signal="slim"))
        for prompt in PROMPTS:
            assert generate(tiny_pair, prompt, "via", cfg).token_ids == generate(tiny_pair, prompt, "ar", cfg).token_ids


def test_via_never_calls_full_model_when_escalate_is_zero(tiny_routed_pair):
    for signal in ("slim", "draft"):
        trace = generate(tiny_routed_pair, "hello world", "via",
                         config(thresholds=Thresholds(accept=0.7, escalate=0.0, signal=signal)))
        assert trace.summary["full_calls"] == 0
        assert trace.summary["tier_counts"]["full"] == 0
        assert trace.summary["new_tokens"] == 32


def test_via_draft_signal_needs_no_verifier_for_confident_drafts(tiny_routed_pair):
    """accept=0 puts every draft in tier A: neither verifier runs, no bonus token is added."""
    trace = generate(tiny_routed_pair, "hello", "via",
                     config(gamma=4, max_unverified=0, thresholds=Thresholds(0.0, 0.0, "draft")))
    assert trace.summary["full_calls"] == 0 and trace.summary["slim_calls"] == 0
    assert all(t["tier"] == "draft" for t in trace.tokens)
    assert all(len(r["candidates"]) == 4 for r in trace.rounds)


def test_via_uses_every_tier_and_escalates_lazily(tiny_routed_pair):
    trace = generate(tiny_routed_pair, "The quick brown fox", "via",
                     config(max_new_tokens=64, thresholds=Thresholds(accept=0.9, escalate=0.5, signal="draft")))
    tiers = {t["tier"] for t in trace.tokens}
    assert tiers == {"draft", "slim", "full"}
    assert 0 < trace.summary["full_calls"] < len(trace.rounds)
    for r in trace.rounds:  # a round that never escalates has no full-model scores
        if not r["full_called"]:
            assert all(c["q_full"] is None for c in r["candidates"])
            assert r["full_ms"] == 0.0


def test_eos_stops_every_method(tiny_pair):
    ar = generate(tiny_pair, "hello world", "ar", config())
    stop_id = ar.token_ids[5]
    first = ar.token_ids.index(stop_id)
    pair = tiny_random_pair(seed=0)
    pair.verifier.generation_config.eos_token_id = stop_id
    for method in ("ar", "sd", "via"):
        trace = generate(pair, "hello world", method, config(thresholds=Thresholds(1.0, 0.2, "draft")))
        assert trace.token_ids == ar.token_ids[: first + 1]


def test_stream_yields_after_every_round_and_stop_ends_between_rounds(tiny_pair):
    seen = [len(t.rounds) for t in stream(tiny_pair, "hello", "sd", config())]
    assert seen == list(range(1, seen[-1] + 1))
    stop = threading.Event()
    trace = generate(tiny_pair, "hello", "sd", config(max_new_tokens=64),
                     on_round=lambda t: stop.set() if len(t.rounds) == 2 else None, stop=stop)
    assert len(trace.rounds) == 2 and trace.summary["stopped"] is True
    assert trace.summary["new_tokens"] == len(trace.tokens) > 0
    assert "".join(t["text"] for t in trace.tokens) == trace.text


def test_draft_stop_shortens_rounds_and_keeps_sd_lossless(tiny_pair):
    fixed = generate(tiny_pair, "hello world", "sd", config(gamma=6))
    adaptive = generate(tiny_pair, "hello world", "sd", config(gamma=6, draft_stop=0.9))
    assert adaptive.token_ids == fixed.token_ids == generate(tiny_pair, "hello world", "ar", config()).token_ids
    for r in adaptive.rounds:  # drafting stops right after the first unsure draft
        ps = [c["p_draft"] for c in r["candidates"]]
        assert all(p >= 0.9 for p in ps[:-1])
    assert adaptive.summary["drafted"] < fixed.summary["drafted"]


def test_max_new_tokens_is_exact(tiny_pair):
    for n in (1, 2, 7, 13):
        for method in ("ar", "sd", "via"):
            assert len(generate(tiny_pair, "hi", method, config(max_new_tokens=n, gamma=5)).token_ids) == n
