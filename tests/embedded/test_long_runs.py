"""Exact at every length, on real weights: the embedded pair (int4, its default drafter) over 300 new tokens.

One module-scoped pair of runs serves every check (the suite loads the pair once, tests/conftest.py):
greedy SD equals greedy AR token for token over 300 tokens; `lossless` equals SD; progressive
verification (the slim view with its own cache) equals separate slim and full passes when a forced round
makes the slim verifier catch up on more than 64 tokens in one pass.
"""

import pytest

from via_sd import DecodeConfig, Thresholds, generate
from via_sd.weights.heads import FrequentHead

pytestmark = pytest.mark.embedded

PROMPTS = [
    "Write a Python class for a bank account with deposit, withdraw and a transaction log, with docstrings.",
    "Explain, step by step, how a hash map handles collisions, and compare chaining with open addressing.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
]
LONG = DecodeConfig(max_new_tokens=300)  # gamma="auto": the rounds the cost model picks


@pytest.fixture(scope="module")
def ar_sd(embedded_pair):
    """One long prompt: 300 tokens of AR and of SD cost minutes on two cores, and every round of a long run is
    checked token for token (the short-prompt checks are in test_real_weights.py)."""
    return [(generate(embedded_pair, p, "ar", LONG), generate(embedded_pair, p, "sd", LONG)) for p in PROMPTS[:1]]


def test_greedy_sd_equals_ar_over_300_tokens(embedded_pair, ar_sd):
    """With the shipped drafter: int4, fused, its head narrowed to the most frequent tokens (heads.FrequentHead)."""
    assert isinstance(embedded_pair.drafter.get_output_embeddings(), FrequentHead)
    assert "most frequent" in embedded_pair.drafter.via_sd_weights
    for ar, sd in ar_sd:
        assert len(ar.token_ids) > 100  # long runs (a prompt may end sooner than 300 at end of text)
        assert sd.token_ids == ar.token_ids
        assert sd.summary["mean_accepted_length"] > 1.5
        assert sd.rounds[0]["gamma"] == 0 and {r["gamma"] for r in sd.rounds[1:]} <= set(range(1, 17))


def test_lossless_equals_the_first_160_of_sds_300_tokens(embedded_pair, ar_sd):
    """The first 160 of SD's 300 tokens: greedy decoding's tokens do not depend on where a run stops, so lossless
    over 160 new tokens must be SD's first 160 (each run of 300 costs most of a minute on two cores)."""
    lossless = generate(embedded_pair, PROMPTS[0], "via",
                        DecodeConfig(max_new_tokens=160, thresholds=Thresholds.preset("lossless")))
    sd = ar_sd[0][1].token_ids
    assert len(lossless.token_ids) == min(160, len(sd)) and lossless.token_ids == sd[:len(lossless.token_ids)]
    assert lossless.summary["tier_counts"]["full"] == len(lossless.token_ids)


def test_progressive_equals_separate_passes_with_catch_ups_over_64_rows(embedded_pair):
    # every draft in tier A until 80 tokens in a row went unverified: then a forced round sends the drafts to the
    # slim verifier, which first catches up on those 80 tokens in one pass
    forced = dict(max_new_tokens=200, gamma=8, max_unverified=80, slim_cache="own",
                   thresholds=Thresholds(accept=0.0, escalate=0.0, signal="draft"))
    progressive = generate(embedded_pair, PROMPTS[2], "via", DecodeConfig(**forced))
    separate = generate(embedded_pair, PROMPTS[2], "via", DecodeConfig(**forced, progressive=False))
    assert progressive.token_ids == separate.token_ids and len(progressive.token_ids) > 100
    catch_ups = [c["rows"] for r in progressive.rounds for c in r["calls"] if c["model"] != "drafter" and c["past"]]
    assert max(catch_ups) > 64  # a verifier read more than 64 new rows over its cache in one pass
    for a, b in zip(progressive.tokens, separate.tokens):
        assert (a["tier"], a["q_slim"] is None, a["q_full"] is None) == (b["tier"], b["q_slim"] is None,
                                                                           b["q_full"] is None)


def test_greedy_sd_with_prompt_lookup_equals_ar_over_300_tokens(embedded_pair, ar_sd):
    """Prompt lookup (issue 27) on the same prompt: its drafts are kept or replaced by the verifier's own choice."""
    lookup = generate(embedded_pair, PROMPTS[0], "sd", DecodeConfig(max_new_tokens=300, drafter="lookup"))
    assert lookup.token_ids == ar_sd[0][0].token_ids
    assert any(r["drafter"] == "lookup" for r in lookup.rounds)
