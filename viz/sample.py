"""Hand-built traces that follow schema via-sd-trace/1 exactly, for tests, docs and offline demos.

`sample_trace(method)` simulates the decoding loop of `via_sd.core.decoding` with pseudo-random
probabilities instead of models (greedy rules: a verifier keeps a draft iff it is its top choice),
so the trace has every field and every invariant of a real one (tier stickiness after tier C,
discarded drafts after a replacement, bonus tokens, token budget) but needs no model.
"""

from __future__ import annotations

import random

from via_sd.core.trace import Trace, summarize

WORDS = [" the", " slim", " verifier", " keeps", " it", ".", "\n", " draft", " tokens", " <b>", "&", " full",
         " model", " checks", ",", "  two", "\t", "é", " round", " fast"]
COST_MS = {"draft": 2.0, "slim": 5.5, "full": 11.0, "other": 0.4}


def _piece(rng: random.Random) -> tuple[int, str]:
    k = rng.randrange(len(WORDS))
    return k + 10, WORDS[k]


def _emit(tokens: list[dict], k: int, tok_id: int, text: str, tier: str, outcome: str, p=None, qs=None, qf=None,
          r=None) -> None:
    tokens.append({"i": len(tokens), "id": tok_id, "text": text, "round": k, "tier": tier, "outcome": outcome,
                   "p_draft": p, "q_slim": qs, "q_full": qf, "confidence": r})


def _drafts(rng: random.Random, n: int) -> list[dict]:
    """The round's candidates, each with `_top` (the verifiers' top choice?) and `_r` (its slim confidence)."""
    cands = []
    for pos in range(n):
        tok_id, text = _piece(rng)
        top = rng.random() < 0.6  # is the draft the verifiers' top choice?
        r = 1.0 if top else round(rng.random() ** 1.5, 4)
        cands.append({"pos": pos, "token": tok_id, "text": text, "p_draft": round(0.2 + 0.8 * rng.random(), 4),
                      "q_slim": None, "q_full": None, "confidence": None, "tier": None, "decision": "discarded",
                      "_top": top, "_r": r})
    return cands


def _sort(cands: list[dict], method: str, accept: float, escalate: float, signal: str) -> tuple[int, bool]:
    """Sorts the candidates into tiers: (the first tier-C candidate, whether the slim verifier runs)."""
    if method == "sd":
        for c in cands:
            c["tier"] = "full"
        return 0, False
    slim_called = signal == "slim"
    for c in cands:
        c["confidence"] = c["_r"] if signal == "slim" else c["p_draft"]
        if signal == "slim":
            c["q_slim"] = round(c["_r"] * 0.8, 4)
        r = c["confidence"]
        c["tier"] = "draft" if r >= accept else "slim" if r >= escalate else "full"
    tiers = [c["tier"] for c in cands]
    first_full = tiers.index("full") if "full" in tiers else len(cands)
    if signal == "draft" and "slim" in tiers[:first_full]:
        slim_called = True
        for c in cands:
            c["q_slim"] = round(c["_r"] * 0.8, 4)
    return first_full, slim_called


def _before_tier_c(rng: random.Random, tokens: list[dict], k: int, cands: list[dict]) -> bool:
    """Tier A is kept as drafted, tier B kept iff the slim verifier's top choice; True once one is replaced."""
    for c in cands:
        if c["tier"] == "draft":
            c["decision"] = "accepted"
            _emit(tokens, k, c["token"], c["text"], "draft", "kept", c["p_draft"], c["q_slim"], None, c["confidence"])
            continue
        c["decision"] = "kept" if c["_top"] else "replaced"
        if not c["_top"]:
            tok_id, text = _piece(rng)
            _emit(tokens, k, tok_id, text, "slim", "replaced", 0.1, 0.7, None, c["confidence"])
            return True
        _emit(tokens, k, c["token"], c["text"], "slim", "kept", c["p_draft"], c["q_slim"], None, c["confidence"])
    return False


def _from_tier_c(rng: random.Random, tokens: list[dict], k: int, cands: list[dict]) -> bool:
    """The full verifier checks every candidate from the first tier-C one on; True once it replaces one."""
    for c in cands:
        c["tier"] = "full"
        c["q_full"] = round(0.55 + 0.4 * rng.random(), 4) if c["_top"] else round(0.3 * rng.random(), 4)
        c["decision"] = "kept" if c["_top"] else "replaced"
        if not c["_top"]:
            tok_id, text = _piece(rng)
            _emit(tokens, k, tok_id, text, "full", "replaced", 0.05, None, 0.8, c["confidence"])
            return True
        _emit(tokens, k, c["token"], c["text"], "full", "kept", c["p_draft"], c["q_slim"], c["q_full"],
              c["confidence"])
    return False


def _verify(rng: random.Random, tokens: list[dict], k: int, cands: list[dict], method: str,
            thresholds: dict) -> tuple[bool, bool]:
    """Tiers and decides the round's candidates, then the bonus token if none was replaced: (slim, full called)."""
    first_full, slim_called = _sort(cands, method, **thresholds)
    ended = _before_tier_c(rng, tokens, k, cands[:first_full])
    full_called = not ended and first_full < len(cands)
    if full_called:
        ended = _from_tier_c(rng, tokens, k, cands[first_full:])
    if not ended and (full_called or slim_called):
        tok_id, text = _piece(rng)
        tier = "full" if full_called else "slim"
        _emit(tokens, k, tok_id, text, tier, "bonus", qs=0.9 if tier == "slim" else None,
              qf=0.9 if tier == "full" else None)
    return slim_called, full_called


def _round(rng: random.Random, tokens: list[dict], k: int, method: str, n: int, remaining: int, thresholds: dict,
           clock: float) -> dict:
    """One round of `n` drafts starting at `clock`; its tokens go to `tokens`, cut at the token budget."""
    draft_ms = n * COST_MS["draft"] * (0.9 + 0.2 * rng.random())
    cands = _drafts(rng, n)
    before = len(tokens)
    if method == "ar":
        slim_called, full_called = False, True
        tok_id, text = _piece(rng)
        _emit(tokens, k, tok_id, text, "full", "bonus", qf=round(rng.random(), 4))
    else:
        slim_called, full_called = _verify(rng, tokens, k, cands, method, thresholds)
    del tokens[before + remaining:]  # the token budget cuts the last round
    for c in cands:
        del c["_top"], c["_r"]
    other = COST_MS["other"] * (0.8 + 0.4 * rng.random())
    return {"round": k, "start_ms": clock, "draft_ms": draft_ms, "slim_ms": COST_MS["slim"] if slim_called else 0.0,
            "full_ms": COST_MS["full"] if full_called else 0.0, "other_ms": other, "full_called": full_called,
            "slim_called": slim_called, "candidates": cands}


def sample_trace(method: str = "via", gamma: int = 4, max_new_tokens: int = 40, accept: float = 0.6,
                 escalate: float = 0.2, signal: str = "slim", seed: int = 0, prompt: str = "hello world") -> Trace:
    """A schema-exact Trace of `method` ("ar" | "sd" | "via") built without any model."""
    rng = random.Random(seed)
    thresholds = {"accept": accept, "escalate": escalate, "signal": signal}
    config = {"gamma": gamma, "max_new_tokens": max_new_tokens, "temperature": 0.0, "top_p": 1.0, "seed": seed,
              "thresholds": thresholds, "chat": True}
    tokens: list[dict] = []
    rounds: list[dict] = []
    prefill_ms = 6.0 + rng.random()
    clock = prefill_ms
    while len(tokens) < max_new_tokens:
        remaining = max_new_tokens - len(tokens)
        n = 0 if method == "ar" else min(gamma, remaining)
        rnd = _round(rng, tokens, len(rounds), method, n, remaining, thresholds, clock)
        rounds.append(rnd)
        clock += rnd["draft_ms"] + rnd["slim_ms"] + rnd["full_ms"] + rnd["other_ms"]
    text = "".join(t["text"] for t in tokens)
    route = {"drafter": "sample-drafter", "verifier": "sample-verifier", "route": "sample", "skipped": [],
             "skip_fraction": 0.45}
    return Trace(method=method, prompt=prompt, text=text, token_ids=[t["id"] for t in tokens], models=route,
                 config=config, tokens=tokens, rounds=rounds,
                 summary={**summarize(tokens, rounds, prefill_ms, clock), "prompt_tokens": 3})


def sample_traces(**kwargs) -> dict[str, Trace]:
    """{"ar", "sd", "via"} sample traces of one pretend prompt."""
    return {m: sample_trace(m, **kwargs) for m in ("ar", "sd", "via")}
