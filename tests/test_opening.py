"""The chat template's opening, read once per pair (via_sd/core/opening.py): runs read only the rest of their prompt,
greedy SD still equals AR, and nothing a run does reaches the kept opening or the next run."""

import pytest
import torch

from via_sd import DecodeConfig, Thresholds, generate, tiny_random_pair
from via_sd.bench.fidelity import measure_fidelities, measure_fidelity
from via_sd.core.opening import opening_ids, shared_length

TEMPLATE = ("{% for m in messages %}system: answer briefly.\nuser: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
OPENING = "system: answer briefly.\nuser: "
ALL_TIERS = Thresholds(accept=0.9, escalate=0.3, signal="slim")


@pytest.fixture(scope="module")
def chat_pair():
    """The tiny routed pair, its character tokenizer given a chat template with a system turn."""
    pair = tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])
    pair.tokenizer.chat_template = TEMPLATE
    return pair


def test_the_opening_is_what_the_template_puts_before_the_user_message(chat_pair, tiny_pair):
    assert opening_ids(chat_pair.tokenizer) == chat_pair.tokenizer(OPENING, add_special_tokens=False).input_ids
    assert chat_pair.encode("hi")[:len(OPENING)] == chat_pair.openings.ids
    assert opening_ids(tiny_pair.tokenizer) == []  # no chat template: nothing shared


def test_a_cached_opening_stands_for_the_common_start_and_leaves_two_prompt_tokens():
    assert shared_length([5, 6, 7], [5, 6, 7, 8, 9]) == 3
    assert shared_length([5, 6, 7], [5, 6, 1, 8, 9]) == 2  # the prompt begins otherwise at its third token
    assert shared_length([5, 6, 7], [5, 6, 7]) == 1
    assert shared_length([5, 6, 7], [1, 2, 3]) == shared_length([], [1, 2, 3]) == 0


@pytest.mark.parametrize("method", ["ar", "sd", "via"])
def test_every_model_reads_only_the_prompt_past_the_opening_as_a_prompt_read(chat_pair, method):
    cfg = DecodeConfig(gamma=3, max_new_tokens=12, thresholds=ALL_TIERS)
    trace = generate(chat_pair, "The quick brown fox", method, cfg)
    opening, prompt = trace.summary["opening_tokens"], trace.summary["prompt_tokens"]
    assert opening == len(OPENING) and prompt > opening + 2
    first_reads = {}
    for call in (c for r in trace.rounds for c in r["calls"]):
        first_reads.setdefault(call["model"], {k: v for k, v in call.items() if k != "ms"})  # ms: its time
        assert call["past"] >= opening  # nothing before the opening's end is ever read again
        assert call["prompt"] == (call["past"] + call["rows"] <= prompt)
    assert first_reads["full"]["past"] == opening and first_reads["full"]["prompt"]
    assert first_reads["full"]["rows"] in (prompt - opening, prompt - opening - 1)  # - 1: the slim reads the last
    if method != "ar":
        assert first_reads["drafter"] == {"model": "drafter", "rows": prompt - opening, "past": opening,
                                          "resume": False, "prompt": True}


def test_greedy_sd_equals_ar_from_the_opening_and_reading_whole_prompts_changes_no_token(chat_pair):
    for prompt in ("The quick brown fox", "Write a haiku about rain."):
        cfg = DecodeConfig(gamma=3, max_new_tokens=40)
        ar, sd = generate(chat_pair, prompt, "ar", cfg), generate(chat_pair, prompt, "sd", cfg)
        assert sd.token_ids == ar.token_ids and len(ar.token_ids) == 40
        whole = DecodeConfig(gamma=3, max_new_tokens=40, reuse_opening=False)
        ar_whole, sd_whole = generate(chat_pair, prompt, "ar", whole), generate(chat_pair, prompt, "sd", whole)
        assert ar_whole.summary["opening_tokens"] == 0 and ar_whole.rounds[0]["calls"][0]["past"] == 0
        assert sd_whole.token_ids == ar_whole.token_ids == ar.token_ids  # fp32: the split read moves no argmax
        assert measure_fidelity(chat_pair, sd, reference=ar)["agreement"] == 1.0
        assert measure_fidelity(chat_pair, sd_whole, reference=ar_whole)["agreement"] == 1.0
        with pytest.raises(ValueError, match="reuse_opening"):
            measure_fidelities(chat_pair, {"a": ar, "b": ar_whole})


@pytest.mark.parametrize("slim_cache", ["own", "full"])
def test_runs_start_from_copies_and_leave_the_kept_opening_as_it_was(chat_pair, slim_cache):
    """The same prompt decodes the same before and after other runs (the kept caches are never fed)."""
    cfg = DecodeConfig(gamma=3, max_new_tokens=24, thresholds=ALL_TIERS, slim_cache=slim_cache)
    first = generate(chat_pair, "The quick brown fox", "via", cfg)
    generate(chat_pair, "Something else entirely, and longer than the first prompt was.", "via", cfg)
    generate(chat_pair, "Something else", "sd", cfg)
    again = generate(chat_pair, "The quick brown fox", "via", cfg)
    assert again.token_ids == first.token_ids
    assert [t["q_slim"] for t in again.tokens] == [t["q_slim"] for t in first.tokens]
    untimed = lambda trace: [[{k: v for k, v in c.items() if k != "ms"} for c in r["calls"]]  # noqa: E731
                             for r in trace.rounds]
    assert untimed(again) == untimed(first)
    kept = chat_pair.openings.read
    assert kept and all(getattr(m, "seen") == len(OPENING) for m in kept.values())


def test_a_prompt_that_begins_otherwise_is_read_whole(chat_pair):
    trace = generate(chat_pair, "no template here", "sd", DecodeConfig(gamma=3, max_new_tokens=8, chat=False))
    assert trace.summary["opening_tokens"] == 0
    assert [c for c in trace.rounds[0]["calls"] if c["model"] == "full"][0]["past"] == 0


def test_round_one_reads_the_rest_of_the_prompt_once_in_the_shared_layers(chat_pair):
    """Counted per sub-layer with forward hooks, the opening read beforehand (as the first run of a pair does)."""
    from test_plan import _rows_per_sublayer

    escalate = Thresholds(accept=1.0, escalate=0.999, signal="slim")  # the slim pass sorts, then the full pass runs
    cfg = DecodeConfig(gamma=4, max_new_tokens=5, thresholds=escalate, slim_cache="full")
    generate(chat_pair, "warm", "via", cfg)  # reads the opening into the kept caches
    rows, L, rnd = _rows_per_sublayer(chat_pair, "The quick brown fox", cfg)
    rest, n, split = L - len(OPENING), len(rnd["candidates"]), chat_pair.slim.first_skip
    assert rnd["slim_called"] and rnd["full_called"]
    for k in range(chat_pair.slim.sublayers):
        name = f"{'mlp' if k % 2 else 'attn'}.{k // 2}"
        if k < split:  # the shared trunk: every position past the opening once
            assert rows[name] == rest + n, name
        else:  # the full view reads the rest but its last token; the slim view from there; the full view again
            assert rows[name] == (0 if chat_pair.slim.skipped[k] else 1 + n) + (rest - 1) + (1 + n), name


def _int4_chat_pair():
    """A tiny int4 pair whose drafter scores only even ids plus its context's (heads.FrequentHead), with a chat
    template; the character tokenizer padded to the models' 128 ids."""
    from test_weights import tiny_int4_llama

    from via_sd.weights.heads import FrequentHead
    from via_sd.core.pair import ModelPair, char_tokenizer
    from via_sd.core.routing import SlimVerifier, resolve_route

    tokenizer = char_tokenizer()
    tokenizer.add_tokens([f"<x{i}>" for i in range(128 - len(tokenizer))])
    tokenizer.chat_template = TEMPLATE
    drafter, verifier = tiny_int4_llama(seed=0), tiny_int4_llama(seed=0)
    narrow = FrequentHead(drafter.lm_head, torch.arange(0, 128, 2))
    drafter.lm_head = narrow
    narrow.watch(drafter)
    slim = SlimVerifier(verifier, resolve_route(None, verifier.config.num_hidden_layers))
    return ModelPair(drafter, verifier, slim, tokenizer, "int4-2L-narrow", "int4-2L", torch.device("cpu"),
                     torch.float32), narrow


def test_the_drafters_frequency_head_starts_each_run_from_the_opening():
    """A narrowed head (heads.FrequentHead) learns its context's tokens: a run from the kept opening forgets the last
    run's tokens, as a run that reads its whole prompt does."""
    pair, narrow = _int4_chat_pair()
    cfg = DecodeConfig(gamma=3, max_new_tokens=16)
    first = generate(pair, "abc", "sd", cfg)
    other = "XYZ qrs 123 !?"
    generate(pair, other, "sd", cfg)
    again = generate(pair, "abc", "sd", cfg)
    assert again.summary["opening_tokens"] == len(OPENING)
    assert [c["p_draft"] for r in again.rounds for c in r["candidates"]] == \
        [c["p_draft"] for r in first.rounds for c in r["candidates"]]
    this_run = set(pair.encode("abc")) | set(again.token_ids) | set(pair.openings.ids)
    stale = {i for i in pair.tokenizer(other, add_special_tokens=False).input_ids if i % 2} - this_run
    assert stale and narrow.context_ids is None  # each run's tokens stayed with its own drafter cache


def test_copies_of_a_pair_share_its_kept_opening(chat_pair):
    """The app runs each request on a shallow copy (dataclasses.replace, another route): the opening is read once."""
    import dataclasses

    generate(chat_pair, "warm", "sd", DecodeConfig(gamma=2, max_new_tokens=2))
    copy = dataclasses.replace(chat_pair)
    assert copy.openings is chat_pair.openings and "full" in copy.openings.read
    kept = dict(copy.openings.read)
    generate(copy, "The quick brown fox", "sd", DecodeConfig(gamma=2, max_new_tokens=4))
    assert all(copy.openings.read[k] is m for k, m in kept.items())  # nothing read again
