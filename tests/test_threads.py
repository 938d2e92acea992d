"""Runs on one pair from several threads give what they give one after another (per-run state is the run's)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from via_sd import DecodeConfig, Thresholds, generate, load_pair, stream_events

PROMPTS = ["The quick brown fox", "jumps over", "the lazy dog, twice", "and then some more text"]


def _fingerprint(trace) -> tuple:
    """What a run decided: its tokens, and every draft's probability and tier (a mixed-up drafter context or
    row-attention mark would move these)."""
    return (trace.token_ids, [(c["p_draft"], c.get("tier"), c["decision"]) for r in trace.rounds
                              for c in r["candidates"]])


def _in_threads(fn, jobs):
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(fn, jobs))


@pytest.mark.parametrize("weights", ["fp32", "int4"])
def test_four_threads_on_one_pair_give_the_sequential_outputs(weights):
    pair = load_pair("random", weights=weights)
    configs = {"ar": DecodeConfig(max_new_tokens=12), "sd": DecodeConfig(max_new_tokens=12),
               "via": DecodeConfig(max_new_tokens=12, thresholds=Thresholds.preset("paper"))}
    jobs = [(method, prompt) for method in configs for prompt in PROMPTS]
    run = lambda job: _fingerprint(generate(pair, job[1], job[0], configs[job[0]]))  # noqa: E731
    sequential = [run(job) for job in jobs]
    for method in configs:  # four threads at a time, one method each time: every method's state is exercised
        chunk = [job for job in jobs if job[0] == method]
        assert _in_threads(run, chunk) == [sequential[jobs.index(job)] for job in chunk], method


def test_threads_keep_their_own_drafter_head_context():
    """The drafter's frequency-ranked head scores its run's context tokens (heads.FrequentHead): under the draft
    signal that context sorts drafts into tiers, so a run must never see another run's tokens."""
    from test_opening import _int4_chat_pair

    pair, _ = _int4_chat_pair()
    cfg = DecodeConfig(gamma=3, max_new_tokens=10, thresholds=Thresholds.preset("fastest"))
    prompts = ["abc", "XYZ qrs 123 !?", "~~~ odd ids: a c e g", "QQQ www"]
    sequential = [_fingerprint(generate(pair, p, "via", cfg)) for p in prompts]
    assert _in_threads(lambda p: _fingerprint(generate(pair, p, "via", cfg)), prompts * 2) == sequential * 2


def test_interleaved_streams_in_one_thread_keep_their_own_state():
    """Two live runs advanced in turn (as a server's event loop may) give each its own sequential result."""
    pair = load_pair("random", weights="int4")
    cfg = DecodeConfig(max_new_tokens=10)
    alone = [_fingerprint(generate(pair, p, "sd", cfg)) for p in PROMPTS[:2]]
    streams = [stream_events(pair, p, "sd", cfg) for p in PROMPTS[:2]]
    last = [None, None]
    while any(s is not None for s in streams):
        for i, s in enumerate(streams):
            if s is not None:
                event = next(s, None)
                if event is None:
                    streams[i] = None
                else:
                    last[i] = event.trace
    assert [_fingerprint(t) for t in last] == alone
