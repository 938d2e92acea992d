"""One round of speculative decoding, as the papers write it (gpt-fast's `speculative_decode`, with VIA-SD's tiers).

`speculative_round` is the algorithm alone: draft, one verification, accept or resample, bonus. What it runs its
steps through is `Steps`: it times drafting and every verifier pass, and writes every decision into the round's
record (record.Round), so the round holds no timing, no events and no pricing. The round reports its progress to
whoever drives it by yielding "drafts" (the drafts are proposed, every one pending) and "decided" (a group of
drafts is decided: tier A at once, tier B after the slim pass, tier C after the full pass), and returns nothing:
what it decided is in the Round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from .plan import DRAFT, FULL, SLIM, Thresholds, plan_round, sort_tiers
from .record import Emitted, Round, candidates
from .sampling import Sampler, relative_confidence


def speculative_round(steps: "Steps", seq: list[int], limit: int) -> Iterator[str]:
    """One round after `seq`, of at most `limit` drafts (0: an AR step).

    The drafter proposes x_1..x_n from p. A verifier's one pass over seq + x_1..x_n gives q at every draft position
    and one more. Draft x_i is kept with probability min(1, q(x_i) / p(x_i)) (greedy: iff x_i = argmax q); the first
    one rejected is replaced by a sample of norm(max(0, q - p)) (greedy: argmax q) and ends the round; when every
    draft is kept, q's last row adds a bonus token. The tokens then follow q exactly (Leviathan et al.).
    In SD, q is the full verifier's for every draft. VIA-SD sorts each draft by its confidence r into tier A (kept as
    drafted, no verifier), B (the slim verifier's q' decides it) or C (the full verifier's q decides it and every
    later draft), and runs each verifier at most once (plan.plan_round says which reads which positions)."""
    drafts = steps.draft(seq, limit)
    n = len(drafts)
    if not n:  # an AR step: the full verifier emits one token
        q, _ = steps.score(FULL, seq, 0, 0)
        steps.bonus(FULL, q.last)
        return
    yield "drafts"
    tiers, q_slim = steps.sort(seq)  # SD: every draft in tier C; VIA-SD: by r (the slim signal: after a slim pass)
    plan = plan_round(tiers, steps.slim_sorts)
    full_from = plan.full[0] if plan.full else n
    k = 0
    while k < full_from and plan.decide[k] == DRAFT:  # tier A: kept as drafted
        steps.keep(k)
        k += 1
    if k:
        yield "decided"
    if plan.slim is not None and q_slim is None:  # the draft signal: the slim pass over its stretch only
        q_slim, _ = steps.score(SLIM, seq, *plan.slim)
    decided_by_slim = False
    for i in range(k, full_from):  # tiers A and B before the first tier-C draft, in order
        if plan.decide[i] == DRAFT:
            steps.keep(i)
            continue
        decided_by_slim = True
        if not steps.check(SLIM, q_slim, i):  # replaced: the round ends
            yield "decided"
            return
    if plan.full is None and plan.bonus == SLIM:  # the round never escalated: the slim pass's bonus, if it saw that far
        steps.bonus(SLIM, q_slim.last)
    if decided_by_slim:
        yield "decided"
    if plan.full is None:
        return
    q_full, _ = steps.score(FULL, seq, full_from, n)  # tier C: the full verifier checks the rest
    if all(steps.check(FULL, q_full, i) for i in range(full_from, n)):
        steps.bonus(FULL, q_full.last)
    yield "decided"


@dataclass
class Scores:
    """A verifier pass's distributions: row i - start scores draft i; the last row is the position after the last
    draft it was fed (the bonus position when it was fed every draft)."""

    q: torch.Tensor
    start: int

    def row(self, i: int) -> torch.Tensor:
        return self.q[i - self.start]

    @property
    def last(self) -> torch.Tensor:
        return self.q[-1]


class Steps:
    """What a round runs its steps through, and reports to: the run's drafter, verifiers (cached.Reader) and
    sampler; it times each step and writes each decision into the current Round."""

    def __init__(self, drafter, slim, full, sampler: Sampler, clock, method: str, thresholds: Thresholds,
                 slim_sorts: bool, tokenizer, vocab: int, device):
        self.drafter, self.verifiers, self.sampler, self.clock = drafter, {SLIM: slim, FULL: full}, sampler, clock
        self.method, self.thresholds, self.slim_sorts = method, thresholds, slim_sorts
        self.tokenizer, self.vocab, self.device = tokenizer, vocab, device
        self.rnd = Round()

    def begin(self, forced_by: str | None) -> Round:
        """A new round's record (`forced_by`: "max_unverified" closes tier A this round)."""
        self.rnd, self.drafts, self.p = Round(forced_by=forced_by), [], None
        return self.rnd

    def timed(self, phase: str, fn):
        start = self.clock.ms()
        out = fn()
        self.rnd.phase_ms[phase] += self.clock.ms() - start
        return out

    def draft(self, seq: list[int], limit: int) -> list[int]:
        """The drafter's proposal: its tokens, their distributions p (one-hot where it has none), who drafted."""
        start = self.clock.ms()
        proposal = self.drafter.propose(seq, limit)
        self.rnd.gamma, self.rnd.drafter, tokens = proposal.gamma, proposal.source, proposal.tokens
        if not tokens:
            return []
        self.rnd.phase_ms["draft"] += self.clock.ms() - start
        p = proposal.p
        if p is None:
            p = torch.zeros(len(tokens), self.vocab, device=self.device)
            p[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        self.drafts, self.p = tokens, p
        self.rnd.candidates = candidates(tokens, p, self.tokenizer)
        return tokens

    def sort(self, seq: list[int]) -> tuple[list[str], Scores | None]:
        """The tier of each draft, and the slim pass's scores when the slim signal sorted them (a pass over every
        draft), else None."""
        rnd, th, n = self.rnd, self.thresholds, len(self.drafts)
        if self.method == "sd":
            rnd.sorted_tiers = [FULL] * n
            return rnd.sorted_tiers, None
        q_slim = None
        if self.slim_sorts:
            q_slim, confidence = self.score(SLIM, seq, 0, n)
        elif th.signal == "slim":  # the thresholds alone decide every tier: no slim pass for the signal
            confidence = [None] * n
        else:
            confidence = [c.p_draft for c in rnd.candidates]
        for c, r in zip(rnd.candidates, confidence):
            c.confidence = r
        rnd.sorted_tiers = sort_tiers(confidence, th, bool(rnd.forced_by), self.slim_sorts)
        return rnd.sorted_tiers, q_slim

    def score(self, verifier: str, seq: list[int], start: int, stop: int) -> tuple[Scores, list[float]]:
        """One pass of `verifier` fed up to drafts[:stop]: its scores at draft positions start..stop, and r for
        drafts[start:stop]; records q(x) and the top choice on each candidate."""
        self.rnd.ran(verifier)
        ext = seq + self.drafts[:stop]
        model = self.verifiers[verifier]
        q = self.timed(verifier, lambda: self.sampler.probs(model.logits(ext, len(ext), stop - start + 1)))
        x = torch.tensor(self.drafts[start:stop], device=q.device, dtype=torch.long)
        r, q_x, top = relative_confidence(q[:-1], x)
        for k, (qx, t) in enumerate(zip(q_x.tolist(), top.tolist())):
            self.rnd.candidates[start + k].scored_by(verifier, qx, t)
        return Scores(q, start), r.tolist()

    def keep(self, i: int) -> None:
        """Tier A: draft i kept as drafted."""
        self.decide(i, self.drafts[i], DRAFT, "kept")

    def check(self, verifier: str, scores: Scores, i: int) -> bool:
        """The speculative check of draft i against the verifier's row (sampling.verify_draft); True if kept."""
        q_row = scores.row(i)
        kept, token = self.sampler.check(self.drafts[i], self.p[i], q_row)
        self.decide(i, token, verifier, "kept" if kept else "replaced").scored_by(verifier, float(q_row[token]))
        return kept

    def decide(self, i: int, token: int, tier: str, outcome: str) -> Emitted:
        """Records tier `tier`'s decision on candidate i and the token it emits there (a kept draft carries what
        the verifiers said of it)."""
        rnd, cand, kept = self.rnd, self.rnd.candidates[i], outcome == "kept"
        cand.tier = tier
        cand.decision = "accepted" if tier == DRAFT else outcome
        rnd.kept_drafts += kept
        rnd.emitted.append(Emitted(token, tier, outcome, float(self.p[i][token]), cand.q_slim if kept else None,
                                   cand.q_full if kept else None, cand.confidence))
        return rnd.emitted[-1]

    def bonus(self, verifier: str, q_row: torch.Tensor) -> None:
        """The verifier that ran last adds one token of its own after the kept drafts."""
        token = self.sampler.pick(q_row)
        self.rnd.emitted.append(Emitted(token, verifier, "bonus").scored_by(verifier, float(q_row[token])))
