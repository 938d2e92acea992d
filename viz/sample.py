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

    def emit(k, tok_id, text, tier, outcome, p=None, qs=None, qf=None, r=None):
        tokens.append({"i": len(tokens), "id": tok_id, "text": text, "round": k, "tier": tier, "outcome": outcome,
                       "p_draft": p, "q_slim": qs, "q_full": qf, "confidence": r})

    while len(tokens) < max_new_tokens:
        k = len(rounds)
        remaining = max_new_tokens - len(tokens)
        n = 0 if method == "ar" else min(gamma, remaining)
        ph = {"draft": n * COST_MS["draft"] * (0.9 + 0.2 * rng.random()), "slim": 0.0, "full": 0.0}
        slim_called = full_called = False
        cands = []
        for pos in range(n):
            tok_id, text = _piece(rng)
            top = rng.random() < 0.6  # is the draft the verifiers' top choice?
            r = 1.0 if top else round(rng.random() ** 1.5, 4)
            cands.append({"pos": pos, "token": tok_id, "text": text, "p_draft": round(0.2 + 0.8 * rng.random(), 4),
                          "q_slim": None, "q_full": None, "confidence": None, "tier": None, "decision": "discarded",
                          "_top": top, "_r": r})
        before = len(tokens)
        if method == "ar":
            full_called, ph["full"] = True, COST_MS["full"]
            tok_id, text = _piece(rng)
            emit(k, tok_id, text, "full", "bonus", qf=round(rng.random(), 4))
        else:
            if method == "sd":
                first_full = 0
                for c in cands:
                    c["tier"] = "full"
            else:
                slim_called = signal == "slim"
                for c in cands:
                    c["confidence"] = c["_r"] if signal == "slim" else c["p_draft"]
                    if signal == "slim":
                        c["q_slim"] = round(c["_r"] * 0.8, 4)
                    r = c["confidence"]
                    c["tier"] = "draft" if r >= accept else "slim" if r >= escalate else "full"
                tiers = [c["tier"] for c in cands]
                first_full = tiers.index("full") if "full" in tiers else n
                if signal == "draft" and "slim" in tiers[:first_full]:
                    slim_called = True
                    for c in cands:
                        c["q_slim"] = round(c["_r"] * 0.8, 4)
            if slim_called:
                ph["slim"] = COST_MS["slim"]
            ended = False
            for c in cands[:first_full]:
                if c["tier"] == "draft":
                    c["decision"] = "accepted"
                    emit(k, c["token"], c["text"], "draft", "kept", c["p_draft"], c["q_slim"], None, c["confidence"])
                    continue
                c["decision"] = "kept" if c["_top"] else "replaced"
                if c["_top"]:
                    emit(k, c["token"], c["text"], "slim", "kept", c["p_draft"], c["q_slim"], None, c["confidence"])
                else:
                    tok_id, text = _piece(rng)
                    emit(k, tok_id, text, "slim", "replaced", 0.1, 0.7, None, c["confidence"])
                    ended = True
                    break
            if not ended and first_full < n:
                full_called, ph["full"] = True, COST_MS["full"]
                for c in cands[first_full:]:
                    c["tier"] = "full"
                    c["q_full"] = round(0.55 + 0.4 * rng.random(), 4) if c["_top"] else round(0.3 * rng.random(), 4)
                    c["decision"] = "kept" if c["_top"] else "replaced"
                    if c["_top"]:
                        emit(k, c["token"], c["text"], "full", "kept", c["p_draft"], c["q_slim"], c["q_full"],
                             c["confidence"])
                    else:
                        tok_id, text = _piece(rng)
                        emit(k, tok_id, text, "full", "replaced", 0.05, None, 0.8, c["confidence"])
                        ended = True
                        break
            if not ended and (full_called or slim_called):
                tok_id, text = _piece(rng)
                tier = "full" if full_called else "slim"
                emit(k, tok_id, text, tier, "bonus", qs=0.9 if tier == "slim" else None,
                     qf=0.9 if tier == "full" else None)
        del tokens[before + remaining:]  # the token budget cuts the last round
        for c in cands:
            del c["_top"], c["_r"]
        other = COST_MS["other"] * (0.8 + 0.4 * rng.random())
        rounds.append({"round": k, "start_ms": clock, "draft_ms": ph["draft"], "slim_ms": ph["slim"],
                       "full_ms": ph["full"], "other_ms": other, "full_called": full_called,
                       "slim_called": slim_called, "candidates": cands})
        clock += sum(ph.values()) + other
    text = "".join(t["text"] for t in tokens)
    route = {"drafter": "sample-drafter", "verifier": "sample-verifier", "route": "sample", "skipped": [],
             "skip_fraction": 0.45}
    return Trace(method=method, prompt=prompt, text=text, token_ids=[t["id"] for t in tokens], models=route,
                 config=config, tokens=tokens, rounds=rounds,
                 summary={**summarize(tokens, rounds, prefill_ms, clock), "prompt_tokens": 3})


def sample_traces(**kwargs) -> dict[str, Trace]:
    """{"ar", "sd", "via"} sample traces of one pretend prompt."""
    return {m: sample_trace(m, **kwargs) for m in ("ar", "sd", "via")}
