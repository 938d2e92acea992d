"""Engine v2 (issue 9): the paper's rule by default, live events, exact where promised, no wasted passes,
bounded unverified runs, like-with-like metrics, linear-time bookkeeping, bad input."""

import pytest
import torch

from via_sd import THRESHOLD_PRESETS, DecodeConfig, Thresholds, generate, load_pair, stream, tiny_random_pair
from via_sd.core.decoding import stream_events

PROMPTS = ["hello world", "The quick brown fox", "x = 1\ny = 2\n"]
ALL_TIERS = Thresholds(accept=0.9, escalate=0.5, signal="draft")  # uses A, B and C on the tiny routed pair


def config(**kw):
    kw.setdefault("gamma", 5)  # these are mechanics tests of a fixed round; test_cost_model.py covers gamma="auto"
    kw.setdefault("max_new_tokens", 32)
    kw.setdefault("chat", False)
    return DecodeConfig(**kw)


# ---- presets ------------------------------------------------------------------------------------

def test_the_default_thresholds_are_the_papers_rule():
    assert Thresholds() == THRESHOLD_PRESETS["paper"] == Thresholds.preset("paper")
    assert Thresholds().signal == "slim"
    assert set(THRESHOLD_PRESETS) == {"paper", "fastest", "lossless"}
    with pytest.raises(ValueError, match="unknown threshold preset"):
        Thresholds.preset("turbo")


# ---- live events --------------------------------------------------------------------------------

@pytest.mark.parametrize("method, th", [("via", ALL_TIERS), ("via", Thresholds(0.8, 0.3, "slim")), ("sd", None)])
def test_stream_events_announce_drafts_then_each_tiers_decisions_then_the_round(tiny_routed_pair, method, th):
    cfg = config(max_new_tokens=40, **({"thresholds": th} if th else {}))
    events = list(stream_events(tiny_routed_pair, "The quick brown fox", method, cfg))
    trace = events[-1].trace
    assert [e.round for e in events if e.kind == "round"] == list(range(len(trace.rounds)))
    by_round = {}
    for e in events:
        by_round.setdefault(e.round, []).append(e)
    for k, evs in by_round.items():
        kinds = [e.kind for e in evs]
        assert kinds[0] == "drafts" and kinds[-1] == "round" and set(kinds[1:-1]) == {"decided"}
        assert all(c["decision"] == "pending" and c["tier"] is None and isinstance(c["text"], str)
                   for c in evs[0].candidates)
        decided_before = 0
        for e in evs[1:-1]:  # decisions only accumulate, and each decided draft says who decided it
            decided = [c for c in e.candidates if c["decision"] != "pending"]
            assert len(decided) > decided_before
            decided_before = len(decided)
            assert all(c["tier"] in ("draft", "slim", "full") and c["decision"] in ("accepted", "kept", "replaced")
                       for c in decided)
            assert all(c["tier"] is None for c in e.candidates if c["decision"] == "pending")
        assert evs[-1].candidates == trace.rounds[k]["candidates"]
        assert all(c["decision"] != "pending" for c in evs[-1].candidates)
    if method == "via" and th.signal == "draft":
        kinds_seen = {c["tier"] for e in events if e.kind == "decided" for c in e.candidates if c["tier"]}
        assert kinds_seen == {"draft", "slim", "full"}


def test_stream_yields_the_traces_of_the_round_events(tiny_routed_pair):
    cfg = config(thresholds=ALL_TIERS)
    rounds = [len(t.rounds) for t in stream(tiny_routed_pair, "hello", "via", cfg)]
    events = [(e.round, len(e.trace.rounds)) for e in stream_events(tiny_routed_pair, "hello", "via", cfg)
              if e.kind == "round"]  # the trace grows in place: read it at the event
    assert [n for _, n in events] == rounds == [k + 1 for k, _ in events] == list(range(1, len(rounds) + 1))


# ---- exact where promised -----------------------------------------------------------------------

@pytest.mark.parametrize("th", [THRESHOLD_PRESETS["lossless"], Thresholds(accept=1, escalate=1, signal="slim"),
                                Thresholds(accept=1.0, escalate=1.0, signal="draft")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lossless_thresholds_equal_plain_sd_token_for_token(tiny_routed_pair, th, temperature):
    """Every draft goes to tier C, even one with confidence 1: VIA-SD is plain SD. Under sampling the
    same seed gives the same tokens, so VIA-SD inherits SD's exact sampling (tested below)."""
    for prompt in PROMPTS:
        cfg = config(thresholds=th, temperature=temperature, seed=3)
        via = generate(tiny_routed_pair, prompt, "via", cfg)
        sd = generate(tiny_routed_pair, prompt, "sd", cfg)
        assert via.token_ids == sd.token_ids
        assert via.summary["exact_share"] == 1.0 and via.summary["slim_calls"] == 0
        assert via.summary["full_calls"] == sd.summary["full_calls"]


@torch.no_grad()
def _slim_greedy_ar(pair, prompt: str, n: int) -> list[int]:
    """The slim verifier run as a model of its own: greedy, one token at a time, no cache."""
    from transformers import DynamicCache

    ids = pair.tokenizer(prompt).input_ids
    out = []
    for _ in range(n):
        logits = pair.slim(torch.tensor([ids + out]), past_key_values=DynamicCache()).logits[0, -1, : pair.vocab_size]
        out.append(int(logits.argmax()))
    return out


def test_via_with_accept_1_escalate_0_is_greedy_ar_of_the_slim_verifier(tiny_routed_pair):
    """Slim signal, accept=1, escalate=0: every draft goes to tier B, so the slim verifier decides everything
    (with a cache of its own: it is then greedy AR of the slim network; reading the full verifier's cache, its
    context for the prompt is the full verifier's, read once, and no full verification pass runs)."""
    for slim_cache in ("own", "full"):
        cfg = config(thresholds=Thresholds(accept=1.0, escalate=0.0, signal="slim"), max_new_tokens=24,
                     slim_cache=slim_cache)
        for prompt in PROMPTS:
            via = generate(tiny_routed_pair, prompt, "via", cfg)
            if slim_cache == "own":
                assert via.token_ids == _slim_greedy_ar(tiny_routed_pair, prompt, 24)
            assert via.summary["full_calls"] == 0 and via.summary["tier_counts"]["slim"] == 24
            full_reads = [c for r in via.rounds for c in r["calls"] if c["model"] == "full"]
            assert [c["past"] for c in full_reads] == ([0] if slim_cache == "full" else [])


# ---- no wasted passes ---------------------------------------------------------------------------

def _verifier_passes(pair) -> list:
    """Counts every verifier pass, slim or full: both end at the verifier's final norm."""
    calls = []
    pair.verifier.model.norm.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_a_draft_signal_round_with_tiers_b_c_a_a_a_makes_exactly_one_verifier_call():
    pair = tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])
    calls = _verifier_passes(pair)
    probe = config(gamma=5, max_new_tokens=5, thresholds=Thresholds(0.0, 0.0, "draft"))  # all tier A: drafts only
    for prompt in (f"{a}{b}" for a in "abcdefghijklmnopqrstuvwxyz" for b in " .,;:!?etaoin"):
        p = [c["p_draft"] for c in generate(pair, prompt, "via", probe).rounds[0]["candidates"]]
        if p[1] < p[0] < min(p[2:]):
            break
    else:
        pytest.fail("no prompt gives draft probabilities ordered for tiers [B, C, A, A, A]")
    th = Thresholds(accept=(p[0] + min(p[2:])) / 2, escalate=(p[0] + p[1]) / 2, signal="draft")
    calls.clear()
    events = stream_events(pair, prompt, "via", config(gamma=5, max_new_tokens=6, thresholds=th))
    rnd = next(e for e in events if e.kind == "round").trace.rounds[0]
    assert rnd["candidates"][0]["p_draft"] == p[0]  # the same drafts as the probe
    verifier_reads = [c for c in rnd["calls"] if c["model"] != "drafter"]
    assert len(calls) == len(verifier_reads)  # the trace records every verifier pass
    # one verifier call past the prompt (before it, the full verifier reads the prompt alone, as AR does)
    assert [c["model"] for c in verifier_reads if c["past"] > 0] == ["full"] and not rnd["slim_called"]
    assert rnd["full_called"] and all(c["past"] == 0 for c in verifier_reads[:-1])
    assert [c["tier"] for c in rnd["candidates"][:2]] == ["full", "full"]  # the full pass decided B exactly


def test_each_verifier_runs_at_most_once_a_round_and_only_where_needed():
    pair = tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])
    calls = _verifier_passes(pair)
    for th in (ALL_TIERS, Thresholds(0.8, 0.3, "slim")):
        for prompt in PROMPTS:
            calls.clear()
            trace = generate(pair, prompt, "via", config(thresholds=th, max_new_tokens=48))
            passes = sum(r["slim_called"] + r["full_called"] for r in trace.rounds)
            prompt_reads = sum(c["past"] == 0 for r in trace.rounds for c in r["calls"] if c["model"] != "drafter")
            assert len(calls) == passes + prompt_reads and prompt_reads <= 2
            for r in trace.rounds:
                tiers = [c["tier"] for c in r["candidates"]]
                if th.signal == "draft":  # no tier C -> no full pass; the slim pass only for tier B
                    assert r["full_called"] == ("full" in tiers)
                    assert r["slim_called"] == ("slim" in tiers and "full" not in tiers)
                else:  # the slim pass sorts every draft; the full pass runs only if a tier-C draft is reached
                    decided = [c["tier"] for c in r["candidates"] if c["decision"] != "discarded"]
                    assert r["slim_called"] and r["full_called"] == ("full" in decided)


# ---- bounded unverified runs --------------------------------------------------------------------

def test_max_unverified_sends_a_round_to_a_verifier(tiny_routed_pair):
    everything_a = Thresholds(accept=0.0, escalate=0.0, signal="draft")
    free = generate(tiny_routed_pair, "hello", "via", config(gamma=4, max_unverified=0, thresholds=everything_a))
    assert free.summary["unverified_share"] == 1.0 and free.summary["slim_calls"] == 0
    bounded = generate(tiny_routed_pair, "hello", "via", config(gamma=4, max_unverified=8, thresholds=everything_a))
    forced = [r for r in bounded.rounds if r["forced_by"] == "max_unverified"]
    assert forced and all(r["full_called"] and not r["slim_called"] for r in forced)  # no slim pass sorted them
    assert all(r["forced_by"] is None for r in bounded.rounds if r not in forced)
    run = longest = 0
    for t in bounded.tokens:
        run = run + 1 if t["tier"] == "draft" else 0
        longest = max(longest, run)
    assert longest <= 8 - 1 + 4  # the bound is checked before each round of up to gamma drafts
    assert DecodeConfig().max_unverified > 0


# ---- metrics that compare like with like --------------------------------------------------------

def test_summary_separates_verified_rejections_unverified_and_exact_tokens(tiny_routed_pair):
    for method in ("ar", "sd", "via"):
        trace = generate(tiny_routed_pair, "The quick brown fox", method, config(thresholds=ALL_TIERS))
        s, cands = trace.summary, [c for r in trace.rounds for c in r["candidates"]]
        checked = [c for c in cands if c["decision"] in ("kept", "replaced")]
        assert s["verified_rejection_rate"] == (
            sum(c["decision"] == "replaced" for c in checked) / len(checked) if checked else 0.0)
        assert s["unverified_share"] == sum(t["tier"] == "draft" for t in trace.tokens) / len(trace.tokens)
        assert s["exact_share"] == sum(t["tier"] == "full" for t in trace.tokens) / len(trace.tokens)
        kept = sum(c["decision"] in ("accepted", "kept") for c in cands)
        assert s["rejection_rate"] == (1 - kept / len(cands) if cands else 0.0)
        if method == "via":
            assert 0 < s["unverified_share"] < 1 and 0 < s["exact_share"] < 1
        else:
            assert s["exact_share"] == 1.0 and s["unverified_share"] == 0.0


# ---- linear-time bookkeeping --------------------------------------------------------------------

class CountingTokenizer:
    """A real tokenizer that counts how many ids it was asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kw)


def test_token_texts_concatenate_to_the_decoded_text_at_every_step_in_linear_time():
    from via_sd.core.decoding import TokenText
    from via_sd.core.pair import char_tokenizer

    tok = char_tokenizer()
    tok.clean_up_tokenization_spaces = True  # rewrites " ," -> ",", " n't" -> "n't": text already handed out
    pieces = [" ", ",", ".", "n", "'", "t", "s", "m", "a", "b", "!", "?", "\n", "<eos>"]
    gen = torch.Generator().manual_seed(0)
    ids = [tok.convert_tokens_to_ids(pieces[int(i)]) for i in torch.randint(len(pieces), (3000,), generator=gen)]
    counting = CountingTokenizer(tok)
    text = TokenText(counting)
    resyncs = 0
    for n, token in enumerate(ids, 1):
        changed = text.add(token)
        resyncs += len(changed) > 1
        assert text.text == tok.decode(ids[:n], skip_special_tokens=True)
    assert text.flush() == {}  # nothing left to correct at the end
    assert text.text == tok.decode(ids, skip_special_tokens=True)
    assert resyncs > 0  # the tokenizer did rewrite earlier text, and the pieces followed
    # each token decodes a window of at most 2 * WINDOW + 1 ids, rewrites included, and the end checks the
    # whole text once: linear, not quadratic
    assert counting.decoded <= (2 * TokenText.WINDOW + 2) * len(ids)


def test_the_summary_is_kept_per_round_not_recomputed_from_the_whole_trace(tiny_routed_pair):
    from via_sd.core.trace import summarize

    trace = generate(tiny_routed_pair, "hello", "via", config(thresholds=ALL_TIERS, max_new_tokens=48))
    again = summarize(trace.tokens, trace.rounds, trace.summary["prefill_ms"], trace.summary["wall_ms"])
    counted = {k: v for k, v in trace.summary.items() if k not in ("prompt_tokens", "opening_tokens", "stopped",
                                                          "predicted_tokens_per_s")}
    assert counted == again


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    ({"seed": 1.5}, "seed must be a whole number"), ({"seed": True}, "seed must be a whole number"),
    ({"gamma": 2.0}, 'gamma .* must be "auto" .* or a whole number'), ({"gamma": False}, "gamma .* whole number"),
    ({"temperature": 1e-30}, "so small that logits overflow"), ({"temperature": True}, "temperature must be a number"),
    ({"max_unverified": -1}, "max_unverified"), ({"thresholds": {"accept": 0.5}}, "Thresholds"),
])
def test_bad_settings_are_value_errors_that_say_what_to_change(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DecodeConfig(**kwargs)


def test_bool_thresholds_bad_routes_and_configs_are_refused(tiny_pair):
    from via_sd import Route, SlimVerifier

    with pytest.raises(ValueError, match="not a bool"):
        Thresholds(accept=True, escalate=0.0)
    for skip in (("attn.0",), ("mlp.3",)):
        with pytest.raises(ValueError, match="first or last layer"):
            SlimVerifier(tiny_pair.verifier, Route("bad", skip, 4))
    with pytest.raises(ValueError, match="DecodeConfig"):
        generate(tiny_pair, "hello", "via", {"gamma": 3})


# ---- the embedded real pair: one check each -----------------------------------------------------

# ---- sampled SD follows the verifier at every position ------------------------------------------

def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; bins expected below 5 are pooled into one."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def assert_samples_follow_the_verifier(pair, prompt_ids, samples, temperature: float, top_p: float = 1.0):
    """samples: position j -> prefix (the j tokens before) -> the tokens seen at j. At each position the prefix
    groups of at least 40 runs must follow q(. | prompt + prefix): no token outside q's support, and the groups'
    chi-square statistics added up pass at significance 0.001."""
    from via_sd.core.sampling import logits_to_probs

    for j, groups in samples.items():
        stat, dof = 0.0, 0
        for prefix, tokens in groups.items():
            if len(tokens) < 40:
                continue
            with torch.no_grad():
                logits = pair.verifier(torch.tensor([prompt_ids + list(prefix)])).logits[0, -1, : pair.vocab_size]
            q = logits_to_probs(logits, temperature, top_p)
            counts = torch.bincount(torch.tensor(tokens), minlength=q.numel()).float()
            assert counts[q == 0].sum() == 0, "a token outside the verifier's (top-p) support was emitted"
            s, d = _chi_square(counts, q)
            stat, dof = stat + s, dof + d
        assert dof > 0, f"no prefix at position {j} had enough runs"
        p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))
        assert p_value > 1e-3, f"position {j}: chi-square p = {p_value:.2e}"


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampled_sd_follows_the_verifier_at_every_draft_position_and_the_bonus(top_p):
    """gamma = 2, one round per run: output token j (j = 0, 1 drafts, j = 2 the bonus) given the tokens before
    it must follow q(. | prompt + those tokens) over the runs whose first round reached position j. Runs are
    grouped by that prefix; the groups' chi-square statistics add up (significance 0.001 per position)."""
    pair = tiny_random_pair(seed=3, verifier_layers=3)
    with torch.no_grad():  # a drafter that differs enough that residual resampling happens at each position
        pair.drafter.lm_head.weight.add_(torch.randn(pair.drafter.lm_head.weight.shape,
                                                     generator=torch.Generator().manual_seed(0)) * 0.2)
    prompt, temperature, gamma, runs = "the cat", 2.0, 2, 1500
    prompt_ids = pair.tokenizer(prompt).input_ids
    samples = {j: {} for j in range(gamma + 1)}  # position -> prefix -> tokens seen there
    replaced = [0] * gamma
    for seed in range(runs):
        trace = generate(pair, prompt, "sd", config(gamma=gamma, max_new_tokens=gamma + 1, temperature=temperature,
                                                     top_p=top_p, seed=seed))
        cands = trace.rounds[0]["candidates"]
        for j in range(gamma + 1):
            samples[j].setdefault(tuple(trace.token_ids[:j]), []).append(trace.token_ids[j])
            if j < gamma and cands[j]["decision"] == "replaced":
                replaced[j] += 1
                break
    assert all(r > 0.03 * runs for r in replaced), f"residual resampling barely exercised: {replaced}"
    assert_samples_follow_the_verifier(pair, prompt_ids, samples, temperature, top_p)


# ---- progressive verification -------------------------------------------------------------------

@pytest.mark.parametrize("route", [["attn.1", "mlp.2"], ["mlp.2"], ["attn.2"]])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_progressive_verification_gives_the_same_tokens_and_scores_as_separate_passes(route, temperature):
    """Shared sub-layers before the first skip, full passes resuming from the slim pass's hidden states,
    lazy catch-up and rollbacks over many rounds: the same tokens, and every q_slim / q_full to fp tolerance."""
    pair = tiny_random_pair(seed=0, route=route)
    rounds = escalating = 0
    for th in (ALL_TIERS, Thresholds(0.8, 0.3, "slim"), Thresholds(0.95, 0.2, "slim")):
        for prompt in PROMPTS:
            # the slim view with a cache of its own: the same network as the separate slim verifier
            cfg = config(thresholds=th, temperature=temperature, seed=5, max_new_tokens=48, slim_cache="own")
            shared = generate(pair, prompt, "via", cfg)
            separate = generate(pair, prompt, "via", DecodeConfig(**{**cfg.__dict__, "progressive": False}))
            assert shared.token_ids == separate.token_ids
            rounds += len(shared.rounds)
            escalating += sum(r["slim_called"] and r["full_called"] for r in shared.rounds)
            for a, b in zip(shared.rounds, separate.rounds):
                assert (a["slim_called"], a["full_called"]) == (b["slim_called"], b["full_called"])
                for ca, cb in zip(a["candidates"], b["candidates"]):
                    for key in ("q_slim", "q_full"):
                        assert (ca[key] is None) == (cb[key] is None)
                        if ca[key] is not None:
                            assert ca[key] == pytest.approx(cb[key], abs=1e-5)
    assert rounds > 80 and escalating > 10  # many rounds, many of them resuming a full pass from a slim pass


def test_discarded_drafts_keep_the_tier_they_were_sorted_into(tiny_routed_pair):
    for method, th in (("sd", Thresholds()), ("via", ALL_TIERS)):
        traces = [generate(tiny_routed_pair, prompt, method, config(thresholds=th)) for prompt in PROMPTS]
        discarded = [c for t in traces for r in t.rounds for c in r["candidates"] if c["decision"] == "discarded"]
        assert discarded and all(c["tier"] in ("draft", "slim", "full") for c in discarded)


def test_the_full_verifier_reads_the_prompt_alone_then_extends_its_cache_like_steps():
    """Reader(prompt=L): a first call past the prompt reads the prompt in a call of its own (as AR's first
    call), then the rest, returns the asked-for positions of both in order, and records both forwards."""
    from via_sd.core.cached import CachedModel, Reader

    pair = load_pair("random", weights="int4", route="none")
    seq = pair.encode("The quick brown fox jumps over", chat=False)
    prompt = len(seq) - 5
    fed, calls = [], []

    def forward(input_ids, **kwargs):
        fed.append(input_ids.shape[1])
        return pair.verifier(input_ids=input_ids, **kwargs)

    vocab = pair.vocab_size
    batch = Reader(CachedModel(forward, vocab, "cpu", "cpu"), "full", prompt, calls).logits(seq, len(seq), 6)
    assert fed == [prompt, 5] and batch.shape == (6, vocab)
    assert calls == [{"model": "full", "rows": prompt, "past": 0, "resume": False, "prompt": True},
                     {"model": "full", "rows": 5, "past": prompt, "resume": False, "prompt": False}]
    steps_model = CachedModel(pair.verifier, vocab, "cpu", "cpu")
    steps = torch.cat([steps_model.logits(seq, n, 1) for n in range(prompt, len(seq) + 1)])
    # to fp32 rounding, not bit for bit: this tiny pair's 98-token head cannot be int4 (rows must be a multiple
    # of 16) and stays an fp32 matmul whose rounding depends on the batch; tests/test_exact.py checks bit for
    # bit on models that are int4 throughout
    assert torch.allclose(batch, steps, atol=1e-5) and torch.equal(batch.argmax(-1), steps.argmax(-1))
    fed.clear()
    later = Reader(CachedModel(forward, vocab, "cpu", "cpu"), "full", prompt, [])
    assert later.logits(seq, len(seq), 2).shape == (2, vocab) and fed == [prompt, 5]  # no prompt position asked
