"""The engine on real weights: the embedded Qwen2.5-Coder 0.5B -> 1.5B pair (slow on CPU)."""

import json

import pytest
import torch

from via_sd import THRESHOLD_PRESETS, DecodeConfig, Thresholds, generate, load_pair
from via_sd.core.cached import CachedModel, drafter_cache
from via_sd.core.routing import ROUTES_DIR
from via_sd.route_search import Calibration, TeacherForced, sublayer_index
from via_sd.weights.lean_forward import LeanDecoder

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


def test_on_the_embedded_pair_lossless_equals_sd_and_token_texts_concatenate_to_the_text(embedded_pair):
    prompt = "Write a Python function that greets a user in French (é, ç) and in Japanese (こんにちは)."
    cfg = DecodeConfig(gamma=5, max_new_tokens=24, thresholds=THRESHOLD_PRESETS["lossless"])
    traces = {m: generate(embedded_pair, prompt, m, cfg) for m in ("sd", "via")}
    traces["paper"] = generate(embedded_pair, prompt, "via", DecodeConfig(gamma=5, max_new_tokens=24))
    assert traces["via"].token_ids == traces["sd"].token_ids
    for trace in traces.values():
        assert "".join(t["text"] for t in trace.tokens) == trace.text == embedded_pair.tokenizer.decode(
            trace.token_ids, skip_special_tokens=True)


def test_the_embedded_drafter_through_the_lean_forward_proposes_what_transformers_forward_does(embedded_pair):
    """The real Qwen2 drafter (int4, fused, frequency-ranked head): the same logits step by step."""
    pair = embedded_pair
    seq = pair.encode("Write a Python function that merges two sorted lists.") + list(range(1000, 1030))
    prompt = len(seq) - 30
    ref = CachedModel(pair.drafter, pair.vocab_size, "cpu", "cpu")
    lean = drafter_cache(pair.drafter, pair.vocab_size, "cpu", "cpu")
    assert isinstance(lean, LeanDecoder)
    for upto, keep in [(prompt, 1), *((n, 1) for n in range(prompt + 1, prompt + 20)), (prompt + 24, 4),
                       (prompt + 22, 2), (prompt + 30, 8)]:
        a, b = ref.logits(seq, upto, keep), lean.logits(seq, upto, keep)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        torch.testing.assert_close(b, a, atol=0.05, rtol=0)


def test_embedded_default_route_agreement_is_reproduced(embedded_pair):
    from via_sd.route_search import CALIBRATION_DIR

    data = json.loads((ROUTES_DIR / "embedded-default.json").read_text())
    texts_ = json.loads((CALIBRATION_DIR / "embedded.json").read_text())
    skip = {sublayer_index(s) for s in data["skip"]}
    # the agreement was measured on the weights the route file records (files older than that field: fp32)
    setting = data["cost"].get("weights_setting", "fp32")
    pair = embedded_pair if embedded_pair.weights == setting else load_pair("embedded", weights=setting)
    for key in ("calibration", "held_out"):
        if key in data:
            again = TeacherForced(pair.verifier, Calibration.from_dict(texts_[key])).evaluate(skip)
            # the forward gives the same bits on every x86 path (test_code_paths.py): only the file's rounding remains
            assert data[key]["top1_agreement"] == pytest.approx(again.agreement, abs=1e-4)
