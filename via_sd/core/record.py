"""A round as the engine decided it (Round), and how it is written into the Trace."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .text import TokenText
from .trace import Tally, Trace


@dataclass
class Round:
    """What one verification step decided: every candidate, the emitted tokens, who ran, how long."""

    gamma: int = 0  # drafts asked for (the drafter may stop early: draft_stop, the token budget)
    candidates: list = field(default_factory=list)
    emitted: list = field(default_factory=list)  # token dicts without i/text/round
    kept_drafts: int = 0
    slim_called: bool = False
    full_called: bool = False
    forced_by: str | None = None  # "max_unverified": tier A is closed this round
    sorted_tiers: list = field(default_factory=list)  # the tier each draft was sorted into
    phase_ms: dict = field(default_factory=lambda: {"draft": 0.0, "slim": 0.0, "full": 0.0})
    calls: list = field(default_factory=list)  # every forward: {"model", "rows", "past", "resume"}


def candidates(drafts: list[int], p: torch.Tensor | None, tokenizer) -> list[dict]:
    """One record per drafted token; "pending" until a tier decides it."""
    if not drafts:
        return []
    p_draft = p[torch.arange(len(drafts)), torch.tensor(drafts, device=p.device)].tolist()
    return [{"pos": i, "token": t, "text": tokenizer.decode([t]), "p_draft": pd, "q_slim": None, "q_full": None,
             "slim_top": None, "full_top": None, "confidence": None, "tier": None, "decision": "pending"}
            for i, (t, pd) in enumerate(zip(drafts, p_draft))]


def until_eos(emitted: list[dict], eos: set[int]) -> list[dict]:
    for n, tok in enumerate(emitted):
        if tok["id"] in eos:
            return emitted[: n + 1]
    return emitted


def record_round(trace: Trace, rnd: Round, emitted: list[dict], text: TokenText, tally: Tally, start_ms: float,
                  total_ms: float) -> None:
    k = len(trace.rounds)
    new = []
    for tok in emitted:
        new.append({"i": len(trace.tokens), "id": tok["id"], "text": "", "round": k,
                    **{f: tok[f] for f in ("tier", "outcome", "p_draft", "q_slim", "q_full", "confidence")}})
        trace.tokens.append(new[-1])
        for i, piece in text.add(tok["id"]).items():
            trace.tokens[i]["text"] = piece
    for c, tier in zip(rnd.candidates, rnd.sorted_tiers):
        if c["decision"] == "pending":  # after a replacement
            c["decision"], c["tier"] = "discarded", c["tier"] or tier
    ph = rnd.phase_ms
    trace.rounds.append({"round": k, "gamma": rnd.gamma, "start_ms": start_ms, "draft_ms": ph["draft"],
                         "slim_ms": ph["slim"],
                         "full_ms": ph["full"], "other_ms": max(total_ms - sum(ph.values()), 0.0),
                         "full_called": rnd.full_called, "slim_called": rnd.slim_called,
                         "forced_by": rnd.forced_by, "calls": rnd.calls, "candidates": rnd.candidates})
    tally.add(trace.rounds[-1], new)
