"""Drafters behind one interface (issue 27): prompt lookup proposes exactly what followed the longest match,
greedy SD equals AR with every drafter, sampled SD with prompt lookup follows the verifier, the early exit shares
the verifier's cache without changing its output, and VIA-SD's draft signal refuses a drafter without p(x)."""

import json

import pytest

from via_sd import DecodeConfig, Thresholds, Trace, generate, tiny_random_pair
from via_sd.core.decoding import Run
from via_sd.core.lookup import LOOKUP_PROVEN_WINDOW, lookup
from via_sd.core.proposal import Outcome

from test_via_decoding import assert_samples_follow_the_verifier

DRAFTERS = ("model", "lookup", "hybrid", "early-exit")
COPY = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n"


def config(**kw):
    kw.setdefault("max_new_tokens", 40)
    kw.setdefault("chat", False)
    return DecodeConfig(**kw)


def test_prompt_lookup_proposes_what_followed_the_longest_first_match_and_nothing_without_one():
    seq = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 6, 1, 2, 3]
    # the 3-gram [1, 2, 3] ends the sequence and occurs at 0: what followed it there
    assert lookup(seq, max_ngram=3, max_tokens=4) == ([9, 9, 5, 2], 3)
    assert lookup(seq, max_ngram=3, max_tokens=2) == ([9, 9], 3)
    # n-grams of at most 2: [2, 3] occurs at 1 and at 6; the first is at 1
    assert lookup(seq, max_ngram=2, max_tokens=3) == ([9, 9, 5], 2)
    # the longest n-gram wins over an earlier shorter one: [5, 2, 3] occurs once, after [2, 3]'s first occurrence
    assert lookup(seq[:8] + [0, 5, 2, 3], max_ngram=3, max_tokens=2) == ([0, 5], 3)
    assert lookup([4, 5, 6, 7], 3, 5) == ([], 0)  # the last token never occurred before
    assert lookup([], 3, 5) == ([], 0) and lookup([4], 3, 5) == ([], 0)
    assert lookup([4, 4, 4], 3, 5) == ([4, 4, 4, 4, 4], 2)  # a repeating stretch goes on repeating
    assert lookup([1, 2, 3, 1, 2], 3, 5) == ([3, 1, 2, 3, 1], 2)


def paying_profile():
    """A cost profile where speculation pays: V(k) = 1 + 0.1 (k - 1), a draft a tenth of a pass."""
    from via_sd.cost.model import CostProfile

    rows = tuple(10.0 * (1.0 + 0.1 * k) for k in range(17))
    return CostProfile(rows, rows, rows, (1.0, 1.0, 1.0), source="a test's: V(k) = 1 + 0.1 (k - 1)")


def pin_paying_profile(monkeypatch, pair):
    """Pins `pair`'s cost profile to `paying_profile()`: with gamma="auto" what a drafter drafts then follows the run's
    matches and acceptance, not the timings a busy machine measured for a tiny model (two workers at once measured
    passes where lookup never paid)."""
    from via_sd.core import profile

    pinned = paying_profile()
    monkeypatch.setitem(profile._MEASURED, profile.profile_path(profile.profile_key(pair)), pinned)
    assert pair.costs is pinned


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_sd_equals_ar_with_every_drafter(tiny_pair, drafter, gamma, monkeypatch):
    if gamma == "auto":
        pin_paying_profile(monkeypatch, tiny_pair)
    ar = generate(tiny_pair, COPY, "ar", config(gamma=gamma))
    sd = generate(tiny_pair, COPY, "sd", config(gamma=gamma, drafter=drafter))
    assert sd.token_ids == ar.token_ids
    assert sd.models["drafter_kind"] == drafter and sd.config["drafter"] == drafter
    drafted_by = {r["drafter"] for r in sd.rounds if r["candidates"]}
    if drafter == "hybrid" and gamma == "auto":  # the model drafter drafts only where its prompt read pays
        assert "lookup" in drafted_by and drafted_by <= {"lookup", "model"}
    elif drafter == "hybrid":
        assert drafted_by == {"lookup", "model"}
    else:
        assert drafted_by == {drafter}
    assert Trace.from_json(sd.to_json()) == sd


def test_prompt_lookup_without_a_match_is_an_ar_step_and_runs_no_drafter(tiny_pair):
    trace = generate(tiny_pair, COPY, "sd", config(gamma=4, drafter="lookup"))
    empty = [r for r in trace.rounds if not r["candidates"]]
    assert empty, "the tiny pair's output has rounds with no match"
    for rnd in empty:
        assert rnd["drafter"] is None and [c["model"] for c in rnd["calls"]] == ["full"]
        assert sum(t["round"] == rnd["round"] for t in trace.tokens) == 1
    assert not any(c["model"] == "drafter" for r in trace.rounds for c in r["calls"])
    kept = [sum(c["decision"] == "kept" for c in r["candidates"]) for r in trace.rounds]
    assert max(kept) >= 2, "a repeated stretch is drafted and kept"


def test_sampled_sd_with_prompt_lookup_follows_the_verifier():
    """A prompt whose end ("ab/") recurs: the first round drafts "//" with p one-hot, each kept with probability q(x),
    else a token drawn from q without x. Output token j given the tokens before it follows q at every position
    (later rounds included: lookup or an AR step), chi-square over prefix groups, significance 0.001 per position."""
    pair = tiny_random_pair(seed=3, verifier_layers=3)
    prompt, temperature, gamma, runs = "ab///c ab/", 1.5, 2, 400
    prompt_ids = pair.tokenizer(prompt).input_ids
    samples = {j: {} for j in range(gamma + 1)}
    decisions = {"kept": 0, "replaced": 0}
    for seed in range(runs):
        trace = generate(pair, prompt, "sd", config(gamma=gamma, max_new_tokens=gamma + 1, temperature=temperature,
                                                     seed=seed, drafter="lookup"))
        cands = trace.rounds[0]["candidates"]
        assert [c["text"] for c in cands] == ["/", "/"] and all(c["p_draft"] == 1.0 for c in cands)
        for c in cands:
            decisions[c["decision"]] = decisions.get(c["decision"], 0) + 1
        for j in range(gamma + 1):
            samples[j].setdefault(tuple(trace.token_ids[:j]), []).append(trace.token_ids[j])
    assert decisions["kept"] > 0.1 * runs and decisions["replaced"] > 0.1 * runs, decisions
    assert_samples_follow_the_verifier(pair, prompt_ids, samples, temperature)


def test_the_early_exit_shares_the_verifiers_cache_and_leaves_its_output_unchanged(tiny_pair):
    cfg = config(gamma=3, drafter="early-exit", exit_layer=2)
    run = Run(tiny_pair, COPY, "sd", cfg)
    drafter, full = run.caches.drafter.model, run.caches.full.model
    assert drafter.owner is full.owner  # one network split at the exit: one KV cache for layers 0..1
    assert run.drafter.costs.c < 1.0
    for _ in range(3):  # a few rounds; at each drafts event the shared layers hold the drafted positions already
        before = len(run.seq)
        for event in run.round():
            if event.kind == "drafts":
                # the verification pass computes the shared layers for the last draft only, and resumes from the rest
                assert full.owner.seen == before + len(event.candidates) - 1 and full.seen < before
    ar = generate(tiny_pair, COPY, "ar", cfg)
    sd = generate(tiny_pair, COPY, "sd", cfg)
    assert sd.token_ids == ar.token_ids
    for a, b in zip(ar.tokens, sd.tokens):  # the verifier's probability of every token it decided, unchanged
        if b["q_full"] is not None:
            assert b["q_full"] == pytest.approx(a["q_full"], abs=1e-5)
    via = generate(tiny_pair, COPY, "via", config(gamma=3, drafter="early-exit", exit_layer=2,
                                                  thresholds=Thresholds.preset("lossless")))
    assert via.token_ids == ar.token_ids


def test_vias_draft_signal_refuses_a_drafter_without_p_and_the_slim_signal_takes_every_drafter(tiny_routed_pair):
    draft_signal = Thresholds(accept=0.9, escalate=0.5, signal="draft")
    for drafter in ("lookup", "hybrid"):
        with pytest.raises(ValueError, match="signal='slim'"):
            generate(tiny_routed_pair, COPY, "via", config(gamma=3, drafter=drafter, thresholds=draft_signal))
    generate(tiny_routed_pair, COPY, "via", config(gamma=3, drafter="early-exit", thresholds=draft_signal))
    for drafter in DRAFTERS:
        trace = generate(tiny_routed_pair, COPY, "via", config(gamma=3, drafter=drafter))
        assert len(trace.token_ids) == 40 and trace.summary["tier_counts"]


@pytest.mark.parametrize("kwargs, words", [({"drafter": "ngram"}, "drafter must be one of"),
                                           ({"lookup_ngram": 0}, "lookup_ngram"), ({"exit_layer": -1}, "exit_layer")])
def test_bad_drafter_settings_say_what_to_change(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DecodeConfig(**kwargs)


def test_an_old_trace_without_drafter_fields_still_loads(tiny_pair):
    data = generate(tiny_pair, COPY, "sd", config(gamma=2, max_new_tokens=8)).to_dict()
    for key in ("drafter", "lookup_ngram", "lookup_tokens", "exit_layer"):
        data["config"].pop(key)
    data["models"].pop("drafter_kind")
    for rnd in data["rounds"]:
        rnd.pop("drafter")
    assert Trace.from_json(json.dumps(data)).token_ids == data["token_ids"]


def test_the_bench_runs_each_drafter_and_transformers_own_with_an_identity_check(tiny_pair):
    from via_sd.bench import markdown, run_bench

    methods = ["ar", "sd-lookup", "sd-hybrid", "sd-exit", "via-lookup", "hf-lookup", "hf-exit"]
    result = run_bench(tiny_pair, [COPY], methods=methods, config=config(max_new_tokens=12), repeats=1, warmup=0)
    assert {r["method"]: r["identical_to_ar"] for r in result["runs"]} == dict.fromkeys(methods, True)
    table = markdown(result)
    assert "SD + lookup" in table and "HF prompt lookup" in table and "HF early exit" in table


def test_prompt_lookup_learns_from_rounds_it_did_not_draft_and_earns_long_drafts(tiny_pair):
    """An AR step (or a hybrid's model round) with a match teaches lookup whether that match's first token was right;
    a draft longer than two is earned by rounds that kept every draft, and a rejection shrinks it again (to five at
    least, once the answer has shown that it copies)."""
    lk = Run(tiny_pair, "hello", "sd", config(drafter="lookup", max_new_tokens=8)).drafter
    seq = [5, 6, 7, 8, 9, 5, 6]  # "5 6" occurred before: the match proposes 7 8 9 5 6 7 ...

    def observed(start, emitted):  # a round nobody drafted (an AR step)
        lk.update(Outcome(None, 0, False, [], None, start, emitted))

    def drafted(kept, rejected):
        lk.update(Outcome("lookup", kept, rejected, [], None, len(seq), seq[:kept]))

    assert lk.propose(seq, 0).tokens == []  # no room to draft: it still searches (and observes the round)
    assert lk.match[:4] == [7, 8, 9, 5] and lk.limit(seq) == 2
    before = lk.rates().first
    observed(len(seq), [7])  # the round emitted what the match proposed first
    right = lk.rates().first
    lk.propose(seq, 0)
    observed(len(seq), [4])  # ... and here it would have been wrong
    assert right > before and lk.rates().first < right
    wrong = lk.rates().first
    observed(len(seq) + 1, [7])  # a round from another position is not this match's to learn from
    assert lk.rates().first == wrong
    drafted(1, False)  # one draft kept: the window doubles
    assert lk.limit(seq) == 4
    drafted(2, True)  # a rejection: back to what was kept plus one
    assert lk.limit(seq) == 3
    drafted(0, True)
    assert lk.limit(seq) == 2
    drafted(2, False)  # two drafts kept: the answer copies, the window never falls below 5
    assert lk.limit(seq) == LOOKUP_PROVEN_WINDOW == 5
    drafted(5, False)
    assert lk.limit(seq) == 10
    drafted(0, True)
    assert lk.limit(seq) == LOOKUP_PROVEN_WINDOW
    rates = lk.rates()  # a copy right from its first token goes on: later drafts are kept more often
    assert rates.next > rates.first and rates.emitted(3) == pytest.approx(
        1 + rates.first * (1 + rates.next + rates.next ** 2))


def test_the_lookup_ceiling_script_prices_the_oracle_no_worse_than_a_fixed_lookup(capsys):
    """benchmarks/lookup_ceiling.py (BENCHMARKS.md): the oracle's passes are the least any lookup policy spends."""
    from benchmarks import lookup_ceiling as script

    seq = [1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3, 4]  # after the prompt's end (index 4) the text copies itself

    profile = paying_profile()  # V(k) = 1 + 0.1 (k - 1)
    passes = script.replay(seq, 4, profile, fixed=3)
    assert passes["oracle"] <= min(passes["fixed-3"], passes["ours"])  # no policy spends fewer than the oracle
    assert max(passes["fixed-3"], passes["ours"]) < len(seq) - 5  # and both beat AR's one pass a token
    assert passes["oracle"] == pytest.approx(1.0 + profile.V(8))  # no match yet; then the 8 remaining in one round
    assert script.main(["--preset", "random", "--prompts", "assets/prompts/copy.jsonl", "--limit", "1",
                        "--tokens", "6", "--sweep"]) == 0
    out = capsys.readouterr().out
    fixed = f"fixed-{script.HF_LOOKUP_TOKENS}"  # by default, the bench's transformers peer
    assert "| 1 | 6 |" in out and f"median oracle / {fixed}" in out and f"median ours / {fixed}" in out
    assert "ours, proven window 5 (the engine's): " in out and "fixed-3: " in out


def test_sd_with_gamma_auto_drafts_while_one_more_draft_pays_at_the_drafters_confidence():
    """cost.model.worth_another: a plain SD round goes on while the chain's chance (the product of the drafter's own
    p(x)) times the run's acceptance buys one more draft's cost at the run's rate; a VIA-SD round and a sampled one
    draft offer()'s."""
    import torch

    from via_sd.core.drafters import ModelDrafter
    from via_sd.core.sampling import Sampler
    from via_sd.cost.model import Rates, RoundCost, worth_another

    profile, rates = paying_profile(), Rates()  # a draft 1 ms, a row 1 ms: one more draft costs 2 ms; alpha 0.7
    assert worth_another(profile, rates, 1, chance=0.29, rate=0.1) and not worth_another(profile, rates, 1, 0.28, 0.1)

    class Reader:  # the drafter is sure of its first nine drafts (p ~ 0.9999), then unsure (p ~ 0.2 for each of 5)
        def logits(self, seq, upto, keep):
            logits = torch.zeros(1, 8)
            if len(seq) < 9 + 3:
                logits[0, len(seq) % 8] = 12.0
            else:
                logits[0, :5] = 5.0
            return logits

    sure = [0.0] * 3
    for kind, temperature, drafts in (("sd", 0.0, 10), ("via", 0.0, None), ("sd", 0.7, None)):
        cfg = config(gamma="auto", temperature=temperature)
        drafter = ModelDrafter("model", cfg, profile, RoundCost(kind), Reader(), Sampler(cfg, "cpu"))
        offered = drafter.offer()[0]
        proposal = drafter.propose(list(sure), 16)
        if drafts:  # greedy SD: past the i.i.d. model's round, up to and including the first unsure draft
            assert offered < drafts == len(proposal.tokens) == proposal.gamma
            assert float(proposal.p[-1].max()) < 0.25 < float(proposal.p[-2].max())
        else:
            assert len(proposal.tokens) == proposal.gamma == offered


def test_the_drafter_ceiling_prices_no_policy_below_its_oracle(capsys):
    """benchmarks/drafter_ceiling.py (BENCHMARKS.md): from the positions where the drafter's drafts would be kept, the
    oracle's time is the least over every choice of round sizes, each fixed round size's no less."""
    from benchmarks import drafter_ceiling as script

    seq = [7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8]  # seq[2] comes from the prompt read, the rounds emit seq[3:]
    top1 = [1, 2, 3, 9, 5, 6, 7, 8]  # the drafter's top-1 for seq[3:]: wrong only for seq[6]
    runs = script.kept_runs(top1, seq, 2)
    assert [runs[i] for i in range(3, len(seq))] == [3, 2, 1, 0, 4, 3, 2, 1]
    profile = paying_profile()  # a draft 1 ms, verify(k) 10 + (k - 1) ms
    oracle = script.oracle_ms(runs, 2, len(seq), profile)
    fixed = {g: script.fixed_ms(runs, 2, len(seq), profile, g) for g in range(1, 9)}
    assert oracle <= min(fixed.values()) < 7 * profile.verify(1)  # every policy beats AR's pass a token here
    # two rounds: seq[3:6] drafted and kept, seq[6] the verifier's; then seq[7:10] kept and seq[10] the bonus
    assert oracle == pytest.approx(2 * (3 * 1.0 + profile.verify(4)))
    assert script.main(["--preset", "random", "--limit", "1", "--tokens", "6", "--c", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 6 |" in out and "SD / AR over all 1 prompts" in out and "with c 0.200" in out
