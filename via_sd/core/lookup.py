"""Prompt lookup, a drafter with no model: the longest n-gram (up to `lookup_ngram` tokens) that ends the sequence
(prompt and output) and occurs earlier in it, at its first occurrence, proposes what followed it (up to
`lookup_tokens`); its cost per token c ~ 0.

Cost-aware: with gamma="auto" the cost model caps the draft at the length that pays under the verifier's V(k) (a
long wrong draft costs a wide pass), and a match whose n-gram length has been accepted too rarely to pay drafts
nothing (an AR step). Its acceptance is learned per n-gram length, shrunk toward the acceptance of all its matches
(which starts from a doubtful prior: 0.3, worth two drafts), from the rounds it drafted and from the rounds it did
not (it checks the match it had at a round's start against what the round emitted, for free); the longest draft it
risks grows with drafts kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..cost.model import MAX_GAMMA, CostProfile, Rates, RoundCost
from .proposal import NO_DRAFTS, Outcome, Proposal

LOOKUP_NGRAM, LOOKUP_TOKENS = 3, 10


def lookup(seq: list[int], max_ngram: int = LOOKUP_NGRAM, max_tokens: int = LOOKUP_TOKENS) -> tuple[list[int], int]:
    """Prompt lookup: (what followed the first occurrence of the longest n-gram, n <= max_ngram, that ends `seq`
    and occurs earlier in it, up to max_tokens; n), or ([], 0) when no n-gram of the sequence's end occurs earlier.
    The first occurrence, as transformers' PromptLookupCandidateGenerator takes: it is most often in the prompt, the
    text an answer copies (replayed on copy prompts, it costs fewer passes than the most recent: BENCHMARKS.md). A
    continuation that reaches the sequence's end goes on copying itself (a repeating stretch repeats, as in LZ77)."""
    end = len(seq)
    for n in range(min(max_ngram, end - 1), 0, -1):
        suffix, last = seq[end - n:], seq[-1]
        for start in range(end - n):  # occurrences with at least one token after them
            if seq[start + n - 1] == last and seq[start:start + n] == suffix:
                cont = seq[start + n:start + n + max_tokens]
                while len(cont) < max_tokens:  # past the end: the continuation itself, one period on
                    cont.append(cont[start + n + len(cont) - end])
                return cont, n
    return [], 0


# Prompt lookup's priors, for all its matches together: its first draft is kept with probability 0.3, and a draft
# after a kept one with 0.8 (a copy, once it starts, goes on), each worth two drafts; each n-gram length's own
# counts are shrunk toward those pooled ones with the weight of two drafts. A match proves itself in a round or two
# (drafted, or observed in a round it did not draft: the hybrid's model rounds teach it for free), and on an answer
# that does not copy (a translation) it risks one-token drafts, not the five-token ones a hopeful prior (0.7 for
# every draft, worth ten) paid for.
LOOKUP_FIRST, LOOKUP_NEXT, LOOKUP_PRIOR_WEIGHT, NGRAM_WEIGHT = 0.3, 0.8, 2.0, 2.0
# The longest draft a run's first lookup round risks; a round that keeps all its drafts doubles it (up to
# lookup_tokens), one with a rejection sets it back to what was kept plus one (at least this). An AR step teaches
# it which token comes next, not whether a copy goes on, so a long draft is earned by drafts, as TCP's window is by
# acknowledgements. Once a round has kept two drafts or more (the answer copies), the window never falls below
# LOOKUP_PROVEN_WINDOW: one wrong token in a copy should not cost the next rounds their long drafts, and the cost
# model still picks the length that pays within it (tuned on copy-tune.jsonl: 4, 5, 6, 8 and 10 in BENCHMARKS.md).
LOOKUP_WINDOW, LOOKUP_PROVEN_WINDOW = 2, 5


@dataclass
class CopyRates(Rates):
    """Prompt lookup's acceptance in two parts: a copy is either right from its first token or wrong at once, so one
    per-draft rate (Rates.alpha: independent drafts) would promise long drafts half of which fail at their first
    token. `first_*`: rounds, and those whose first draft was kept; a later draft is kept with probability
    (kept - first_kept) / (trials - first_trials)."""

    first_kept: float = 0.0
    first_trials: float = 0.0

    def add(self, kept: int, rejected: bool, tiers: list[str], lag: int | None = None) -> None:
        super().add(kept, rejected, tiers, lag)
        self._first(kept, rejected)

    def observed(self, kept: int, rejected: bool) -> None:
        """A round observed, not drafted: the acceptance counts alone (no tiers sorted, no verifier lag)."""
        self.kept += kept
        self.trials += kept + int(rejected)
        self._first(kept, rejected)

    def _first(self, kept: int, rejected: bool) -> None:
        if kept or rejected:
            self.first_kept += kept > 0
            self.first_trials += 1

    @property
    def first(self) -> float:
        return self.first_kept / self.first_trials if self.first_trials else 0.0

    @property
    def next(self) -> float:
        later = self.trials - self.first_trials
        return (self.kept - self.first_kept) / later if later > 0 else 0.0

    def emitted(self, gamma: int) -> float:
        """1 + a1 (1 + a + ... + a^(gamma - 1)): the bonus, the first draft kept with a1, each later one with a."""
        a = min(max(self.next, 0.0), 0.999)
        return 1.0 + self.first * (1.0 - a ** gamma) / (1.0 - a)

    def pooled_with(self, prior: "CopyRates", weight: float) -> "CopyRates":
        """These counts plus `weight` drafts' worth of `prior`'s two rates (first drafts and later ones alike)."""
        first_trials, later = self.first_trials + weight, self.trials - self.first_trials + weight
        first_kept = self.first_kept + weight * prior.first
        kept = first_kept + (self.kept - self.first_kept) + weight * prior.next
        return replace(self, kept=kept, trials=first_trials + later, first_kept=first_kept, first_trials=first_trials)


def lookup_prior() -> CopyRates:
    w = LOOKUP_PRIOR_WEIGHT
    return CopyRates(kept=w * (LOOKUP_FIRST + LOOKUP_NEXT), trials=2 * w, first_kept=w * LOOKUP_FIRST, first_trials=w)


class PromptLookup:
    """Prompt lookup as a drafter: no model; each n-gram length learns its own acceptance (a 1-gram match is weak
    evidence). `offer` is what a hybrid (drafters.Hybrid) weighs against the model drafter."""

    name = "lookup"

    def __init__(self, config, base: CostProfile, round_cost: RoundCost, vocab: int):
        self.config, self.round_cost, self.vocab = config, round_cost, vocab
        self.ngram, self.tokens = config.lookup_ngram, config.lookup_tokens
        self.costs = replace(base, draft_ms=(lookup_ms(self.ngram, self.tokens),) * 3)
        self.counts: dict[int, CopyRates] = {}  # per n-gram length, no prior
        self.pooled = lookup_prior()
        self.match, self.n, self.at, self.drafted = [], 0, -1, False
        self.window = LOOKUP_WINDOW  # the longest draft it risks now (gamma="auto"): earned as drafts are kept
        self.floor = LOOKUP_WINDOW  # what a rejection sets it back to: LOOKUP_PROVEN_WINDOW once the answer copies

    def find(self, context: list[int]) -> list[int]:
        if self.at != len(context):  # one search a round
            match, self.n = lookup(context, self.ngram, self.tokens)
            cut = next((i for i, t in enumerate(match) if t >= self.vocab), len(match))
            self.match, self.at = match[:cut], len(context)
        return self.match

    def own(self) -> CopyRates:
        """This n-gram length's own counts (no prior)."""
        return self.counts.setdefault(self.n, CopyRates(kept=0.0, trials=0.0))

    def rates(self) -> CopyRates:
        """A lookup round's estimates: this n-gram length's own counts, shrunk toward all matches' acceptance."""
        return self.own().pooled_with(self.pooled, NGRAM_WEIGHT)

    def limit(self, context: list[int]) -> int:
        """What its match holds; with gamma="auto", no longer than the window its kept drafts have earned."""
        return min(len(self.find(context)), self.window if self.config.auto_gamma else MAX_GAMMA)

    def offer(self, context: list[int]) -> tuple[int, float | None] | None:
        """The lookup round on offer now: (drafts, predicted tokens per ms; None with a fixed gamma), or None: no
        match, or (gamma="auto") a round from this match, at the acceptance such matches have had in this run, is
        predicted to pay no more than an AR step."""
        if not self.find(context):
            return None
        if not self.config.auto_gamma:
            return self.config.gamma, None
        gamma, rate = self.round_cost.best(self.costs, self.rates(), self.limit(context))
        return (gamma, rate) if rate * self.costs.verify(1) > 1.0 else None

    def draft(self, context: list[int], gamma: int) -> Proposal:
        return Proposal("lookup", gamma, self.find(context)[:gamma], None)

    def propose(self, context: list[int], limit: int) -> Proposal:
        offer = self.offer(context)
        return self.draft(context, min(offer[0], limit)) if offer and limit else NO_DRAFTS

    def update(self, outcome: Outcome) -> None:
        if outcome.source == "lookup":
            self.learn(outcome.kept, outcome.rejected, outcome.tiers, outcome.lag)
        self.observe(outcome.start, outcome.emitted)

    def learn(self, kept: int, rejected: bool, tiers: list, lag: int | None) -> None:
        """A round it drafted: the acceptance counts, and the window (doubled when every draft was kept)."""
        self.own().add(kept, rejected, tiers, lag)
        self.pooled.add(kept, rejected, tiers, lag)
        self.drafted = True
        if not rejected and kept >= 2:
            self.floor = LOOKUP_PROVEN_WINDOW
        self.window = max(self.floor, kept + 1) if rejected else min(max(2 * self.window, self.floor), self.tokens)

    def observe(self, start: int, emitted: list[int]) -> None:
        """A round it did not draft: what the match it had then would have kept (under greedy decoding exactly
        what the verifier decides; sampled, the first token is kept with the chance a one-hot draft is)."""
        drafted, self.drafted = self.drafted, False
        seen = min(len(self.match), len(emitted))
        if drafted or not seen or self.at != start:
            return
        kept = next((i for i in range(seen) if self.match[i] != emitted[i]), seen)
        for rates in (self.own(), self.pooled):
            rates.observed(kept, kept < seen)


_LOOKUP_MS: dict = {}


def lookup_ms(ngram: int, tokens: int) -> float:
    """What one prompt-lookup search costs here (a 512-token sequence with no match: the longest search), in ms:
    the lookup's draft_ms (it drafts a whole continuation in one search; counted per token, a bound)."""
    if (ngram, tokens) not in _LOOKUP_MS:
        seq = list(range(512))
        start = time.perf_counter()
        for _ in range(5):
            lookup(seq, ngram, tokens)
        _LOOKUP_MS[(ngram, tokens)] = max((time.perf_counter() - start) * 1000.0 / 5, 1e-4)
    return _LOOKUP_MS[(ngram, tokens)]
