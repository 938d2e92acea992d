"""The engine on real weights: the embedded Qwen2.5-Coder 0.5B -> 1.5B pair (slow on CPU)."""

import pytest

from via_sd import DecodeConfig, Thresholds, generate

pytestmark = pytest.mark.embedded

# Prompts of different kinds, none of them from assets/prompts.
PROMPTS = [
    "Write a Python function that returns the n-th triangular number.",
    "In two sentences, why do leaves change colour in autumn?",
    "A train leaves at 9:40 and arrives at 11:15. How long is the trip? Answer briefly.",
]
GREEDY = DecodeConfig(gamma=5, max_new_tokens=24)


@pytest.fixture(scope="module")
def ar_traces(embedded_pair):
    return [generate(embedded_pair, p, "ar", GREEDY) for p in PROMPTS]


def test_greedy_sd_matches_autoregressive_on_real_weights(embedded_pair, ar_traces):
    for prompt, ar in zip(PROMPTS, ar_traces):
        sd = generate(embedded_pair, prompt, "sd", GREEDY)
        assert sd.token_ids == ar.token_ids
        assert sd.summary["mean_accepted_length"] > 1.5  # a real drafter agrees with its verifier often


def test_a_verification_pass_gives_the_logits_of_one_token_steps_bit_for_bit(embedded_pair):
    """With the default (int4) weights: row-invariant kernels, row attention, an exactly re-scored head."""
    import torch
    from transformers import DynamicCache

    verifier = embedded_pair.verifier
    prompt = torch.tensor([embedded_pair.encode(PROMPTS[1])])
    new = torch.tensor([embedded_pair.encode("Leaves change colour because chlorophyll", chat=False)])
    with torch.inference_mode():
        cache = DynamicCache()
        verifier(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        steps = torch.cat([verifier(new[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0]
                           for i in range(new.shape[1])])
        cache.crop(-new.shape[1])
        batch = verifier(new, past_key_values=cache, use_cache=True, logits_to_keep=new.shape[1]).logits[0]
    assert new.shape[1] >= 6 and torch.equal(batch, steps)


def test_greedy_ar_matches_transformers_generate_on_real_weights(embedded_pair, ar_traces):
    pair = embedded_pair
    ids = pair.encode(PROMPTS[0])
    import torch

    out = pair.verifier.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=sorted(pair.eos_ids))
    assert out[0, len(ids):].tolist() == ar_traces[0].token_ids


def test_via_calls_the_full_model_less_often_than_sd(embedded_pair):
    cfg = DecodeConfig(gamma=5, max_new_tokens=32, thresholds=Thresholds(accept=0.5, escalate=0.1, signal="draft"))
    prompt = PROMPTS[0]
    via = generate(embedded_pair, prompt, "via", cfg)
    sd = generate(embedded_pair, prompt, "sd", cfg)
    assert via.summary["full_calls"] < sd.summary["full_calls"]
    assert via.summary["tier_counts"]["draft"] > 0
    for rnd in (r for r in via.rounds if r["candidates"] and not r["forced_by"]):  # the draft signal's rule
        first = rnd["candidates"][0]  # nothing before it: kept as drafted exactly when p(x) >= accept
        assert (first["tier"] == "draft") == (first["p_draft"] >= 0.5)
        assert all(c["p_draft"] >= 0.5 for c in rnd["candidates"] if c["tier"] == "draft")
    assert "".join(t["text"] for t in via.tokens) == via.text


def test_via_with_escalate_zero_never_calls_the_full_model_on_real_weights(embedded_pair):
    cfg = DecodeConfig(gamma=4, max_new_tokens=16, thresholds=Thresholds(accept=0.6, escalate=0.0, signal="draft"))
    trace = generate(embedded_pair, PROMPTS[1], "via", cfg)
    assert trace.summary["full_calls"] == 0 and trace.summary["new_tokens"] > 0
