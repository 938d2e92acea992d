"""A round as the engine decided it (Round, its Candidates and Emitted tokens: typed records, every field
written by name), and how it is written into the Trace (plain dicts: the schema on disk, via-sd-trace/1)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .plan import FULL, SLIM
from .text import TokenText
from .trace import Tally, Trace


@dataclass
class Candidate:
    """A drafted token and what became of it; `decision` is "pending" until a tier decides it."""

    pos: int
    token: int
    text: str
    p_draft: float
    q_slim: float | None = None  # the slim verifier's probability of the draft, where it scored the position
    q_full: float | None = None
    slim_top: int | None = None  # that verifier's own top choice at the position
    full_top: int | None = None
    confidence: float | None = None  # r, the signal that sorted it into a tier
    tier: str | None = None
    decision: str = "pending"  # accepted (tier A) | kept | replaced | discarded (after a replacement)

    def scored_by(self, verifier: str, q: float, top: int) -> None:
        """What a verifier's pass over this position said: its probability of the draft and its own top choice."""
        if verifier == SLIM:
            self.q_slim, self.slim_top = q, top
        else:
            self.q_full, self.full_top = q, top


@dataclass
class Emitted:
    """A token a round emits: a kept draft, a verifier's replacement, or the bonus token after the kept drafts."""

    id: int
    tier: str
    outcome: str  # kept | replaced | bonus
    p_draft: float | None = None
    q_slim: float | None = None
    q_full: float | None = None
    confidence: float | None = None

    def scored_by(self, verifier: str, q: float) -> "Emitted":
        """The deciding verifier's probability of this token."""
        if verifier == SLIM:
            self.q_slim = q
        elif verifier == FULL:
            self.q_full = q
        return self


@dataclass
class Round:
    """What one verification step decided: every candidate, the emitted tokens, who ran, how long."""

    gamma: int = 0  # drafts asked for (the drafter may stop early: draft_stop, the token budget)
    candidates: list[Candidate] = field(default_factory=list)
    emitted: list[Emitted] = field(default_factory=list)
    kept_drafts: int = 0
    slim_called: bool = False
    full_called: bool = False
    forced_by: str | None = None  # "max_unverified": tier A is closed this round
    drafter: str | None = None  # who drafted: "model" | "lookup" | "early-exit"; None: no drafts (an AR step)
    sorted_tiers: list = field(default_factory=list)  # the tier each draft was sorted into
    phase_ms: dict = field(default_factory=lambda: {"draft": 0.0, "slim": 0.0, "full": 0.0})
    calls: list = field(default_factory=list)  # every forward: {"model", "rows", "past", "resume", "prompt"}

    def ran(self, verifier: str) -> None:
        """A verifier's pass ran this round."""
        if verifier == SLIM:
            self.slim_called = True
        else:
            self.full_called = True


def candidates(drafts: list[int], p: torch.Tensor | None, tokenizer) -> list[Candidate]:
    """One record per drafted token; "pending" until a tier decides it."""
    if not drafts:
        return []
    p_draft = p[torch.arange(len(drafts)), torch.tensor(drafts, device=p.device)].tolist()
    return [Candidate(i, t, tokenizer.decode([t]), pd) for i, (t, pd) in enumerate(zip(drafts, p_draft))]


def until_eos(emitted: list[Emitted], eos: set[int]) -> list[Emitted]:
    for n, tok in enumerate(emitted):
        if tok.id in eos:
            return emitted[: n + 1]
    return emitted


def record_round(trace: Trace, rnd: Round, emitted: list[dict], text: TokenText, tally: Tally, start_ms: float,
                  total_ms: float) -> None:
    k = len(trace.rounds)
    new = []
    for tok in emitted:
        new.append({"i": len(trace.tokens), "id": tok.id, "text": "", "round": k, "tier": tok.tier,
                    "outcome": tok.outcome, "p_draft": tok.p_draft, "q_slim": tok.q_slim, "q_full": tok.q_full,
                    "confidence": tok.confidence})
        trace.tokens.append(new[-1])
        for i, piece in text.add(tok.id).items():
            trace.tokens[i]["text"] = piece
    for c, tier in zip(rnd.candidates, rnd.sorted_tiers):
        if c.decision == "pending":  # after a replacement
            c.decision, c.tier = "discarded", c.tier or tier
    ph = rnd.phase_ms
    trace.rounds.append({"round": k, "gamma": rnd.gamma, "start_ms": start_ms, "draft_ms": ph["draft"],
                         "slim_ms": ph["slim"],
                         "full_ms": ph["full"], "other_ms": max(total_ms - sum(ph.values()), 0.0),
                         "full_called": rnd.full_called, "slim_called": rnd.slim_called,
                         "forced_by": rnd.forced_by, "drafter": rnd.drafter, "calls": rnd.calls,
                         "candidates": [asdict(c) for c in rnd.candidates]})
    tally.add(trace.rounds[-1], new)
