"""What proposes a round's tokens, behind one narrow interface (in the spirit of transformers'
`CandidateGenerator`), and the four drafters behind it.

    drafter.source(seq)          who drafts this round: "model", "lookup" or "early-exit" (a hybrid names
                                 the part it picks), or None: no drafts, the round is an AR step (no pass
                                 is wasted on a draft nobody proposed)
    drafter.propose(seq, gamma)  up to gamma tokens and their distributions p [n, V], or None where the drafter
                                 has none (prompt lookup): the decoder then makes p one-hot, so sampled SD stays
                                 exact (x is kept with probability q(x), else a token is drawn from q without x)
    drafter.learn(source, ...)   what the round's outcome tells it: its running acceptance per source, which
                                 the cost model (gamma="auto") and prompt lookup's "does a draft pay" read
    drafter.observe(start, emitted)  every round's emitted tokens, whoever drafted: prompt lookup checks the match it
                                 had at the round's start against them, so it learns what its drafts would have
                                 kept in rounds it did not draft (an AR step, the hybrid's model rounds) for free
    drafter.profile(source)      the pair's cost profile with this drafter's cost per token in draft_ms

The drafters (DecodeConfig(drafter=...)):
    model       the pair's small model (today's drafter, unchanged)
    lookup      prompt lookup: the longest n-gram (up to `lookup_ngram` tokens) that ends the sequence (prompt
                and output) and occurs earlier in it, at its first occurrence, proposes what followed it
                (up to `lookup_tokens`); no model, c ~ 0. Cost-aware: with gamma="auto" the cost model caps the
                draft at the length that pays under the verifier's V(k) (a long wrong draft costs a wide pass),
                and a match whose n-gram length has been accepted too rarely to pay drafts nothing (an AR step).
                Its acceptance is learned per n-gram length, shrunk toward the acceptance of all its matches
                (which starts from a doubtful prior: 0.3, worth two drafts), from the rounds it drafted and,
                through `observe`, from the rounds it did not; the longest draft it risks grows with drafts kept
    hybrid      prompt lookup when it has a match whose round is predicted to pay more than the model drafter's
                (each at its own acceptance in this run; with a fixed gamma: any match), else the model drafter,
                or an AR step where neither pays (a model drafter yet to read a long prompt)
    early-exit  the verifier's own first `exit_layer` layers, its final norm and head (self-speculation, as
                LayerSkip / transformers' `assistant_early_exit`); in SD its KV cache for those layers *is* the
                verifier's (progressive.ProgressiveVerifier split at the exit), and the verification pass resumes
                from the drafted positions' hidden states at the exit instead of recomputing them. In VIA-SD the
                slim and full verifier already share their trunk, so the early-exit drafter keeps its own cache.
VIA-SD's `draft` signal sorts tokens by the drafter's own probability: prompt lookup has none, so a lookup or hybrid
drafter under that signal is refused (`check_signal`); the `slim` signal works with every drafter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ..cost.model import MAX_GAMMA, Rates, best_gamma, sd_round_ms, via_round_ms, via_round_tokens
from .early_exit import EarlyExitNet, default_exit_layer, early_exit_verifier, exit_draft_ms, exit_layer_of
from .sampling import pick

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


def check_signal(drafter: str, method: str, signal: str) -> None:
    """VIA-SD's draft signal needs the drafter's probability of each token: prompt lookup has none."""
    if method == "via" and signal == "draft" and drafter in ("lookup", "hybrid"):
        raise ValueError(f"the drafter {drafter!r} proposes tokens without a probability, so VIA-SD's 'draft' signal "
                         "(which sorts tokens by the drafter's own p(x)) cannot sort them: use signal='slim' (the "
                         "paper's rule: the slim verifier's confidence), or drafter='model' / 'early-exit'")


def round_rate(profile, method: str, rates: Rates, slim_sorts: bool, limit: int = MAX_GAMMA) -> float:
    """Predicted tokens per ms of the best round of at most `limit` drafts (AR's rate is 1 / verify(1))."""
    gamma = best_gamma(profile, method, rates, slim_sorts, limit=limit)
    if method == "sd":
        return rates.emitted(gamma) / sd_round_ms(profile, gamma)
    return via_round_tokens(gamma, rates, slim_sorts) / via_round_ms(profile, gamma, rates, slim_sorts)


class Drafter:
    """The model drafter (or any model that drafts one token a step through a cache: the early exit)."""

    name = "model"

    def __init__(self, dec, reader, base_profile, draft_ms=None):
        self.dec, self.reader = dec, reader  # dec: probs, config, generator (the decoder's)
        self.rates: dict = {}
        self.profiles = {self.name: base_profile if draft_ms is None else replace(base_profile, draft_ms=draft_ms)}

    def source(self, seq: list[int]) -> str | None:
        return self.name

    def key(self, source: str) -> str:
        """The running estimates a round of `source` learns into."""
        return source

    def profile(self, source: str):
        return self.profiles[source]

    @property
    def costs(self):
        """The profile whose draft_ms prices this drafter's recorded forwards (a hybrid's are the model's)."""
        return self.profiles["model" if "model" in self.profiles else self.name]

    def rates_for(self, source: str) -> Rates:
        return self.rates.setdefault(self.key(source), Rates())

    def limit(self, seq: list[int]) -> int:
        """The most tokens it can propose now (prompt lookup: what its match holds)."""
        return MAX_GAMMA

    def learn(self, source: str, kept: int, rejected: bool, tiers: list, lag) -> None:
        self.rates_for(source).add(kept, rejected, tiers, lag)

    def observe(self, start: int, emitted: list[int]) -> None:
        """The tokens a round that started at sequence length `start` emitted (a model drafter learns from its own
        rounds only)."""

    def propose(self, seq: list[int], gamma: int) -> tuple[list[int], torch.Tensor | None]:
        """Drafts one token a step; stops early once the drafter's p(x) falls below config.draft_stop."""
        dec = self.dec
        tokens, dists, ext = [], [], list(seq)
        for _ in range(gamma):
            p = dec.probs(self.reader.logits(ext, len(ext), 1)[0])
            token = pick(p, dec.config.greedy, dec.generator)
            tokens.append(token)
            dists.append(p)
            ext.append(token)
            if float(p[token]) < dec.config.draft_stop:  # an unsure drafter wastes the next drafts
                break
        return tokens, torch.stack(dists)


class EarlyExit(Drafter):
    name = "early-exit"


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


class PromptLookup(Drafter):
    """Prompt lookup: no model; each n-gram length learns its own acceptance (a 1-gram match is weak evidence)."""

    name = "lookup"

    def __init__(self, dec, base_profile, vocab: int, method: str, slim_sorts: bool):
        cfg = dec.config
        self.dec, self.rates, self.ngram, self.tokens, self.vocab = dec, {}, cfg.lookup_ngram, cfg.lookup_tokens, vocab
        self.method = "sd" if method == "sd" or cfg.thresholds.fixed_tier == "full" else "via"  # as Decoder.gamma
        self.slim_sorts = slim_sorts
        self.profiles = {"lookup": replace(base_profile, draft_ms=(lookup_ms(self.ngram, self.tokens),) * 3)}
        self.pooled = lookup_prior()
        self.match, self.n, self.at, self.rate, self.drafted = [], 0, -1, 0.0, False
        self.window = LOOKUP_WINDOW  # the longest draft it risks now (gamma="auto"): earned as drafts are kept
        self.floor = LOOKUP_WINDOW  # what a rejection sets it back to: LOOKUP_PROVEN_WINDOW once the answer copies

    def find(self, seq: list[int]) -> list[int]:
        if self.at != len(seq):  # one search a round (source and propose ask for the same sequence)
            match, self.n = lookup(seq, self.ngram, self.tokens)
            cut = next((i for i, t in enumerate(match) if t >= self.vocab), len(match))
            self.match, self.at = match[:cut], len(seq)
        return self.match

    def key(self, source: str) -> str:
        return f"lookup{self.n}" if source == "lookup" else source

    def own(self) -> CopyRates:
        """This n-gram length's own counts (no prior)."""
        return self.rates.setdefault(self.key("lookup"), CopyRates(kept=0.0, trials=0.0))

    def rates_for(self, source: str) -> Rates:
        """A lookup round's estimates: this n-gram length's own counts, shrunk toward all matches' acceptance."""
        if source != "lookup":
            return super().rates_for(source)
        return self.own().pooled_with(self.pooled, NGRAM_WEIGHT)

    def learn(self, source: str, kept: int, rejected: bool, tiers: list, lag) -> None:
        if source != "lookup":
            return super().learn(source, kept, rejected, tiers, lag)
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

    def limit(self, seq: list[int]) -> int:
        return self.lookup_limit(seq)

    def lookup_limit(self, seq: list[int]) -> int:
        """What its match holds; with gamma="auto", no longer than the window its kept drafts have earned."""
        return min(len(self.find(seq)), self.window if self.dec.config.auto_gamma else MAX_GAMMA)

    def source(self, seq: list[int]) -> str | None:
        """"lookup" when the sequence's end occurs earlier and a draft from a match of this n-gram length, as long
        as the match, pays (gamma="auto": at the acceptance such matches have had in this run), else None."""
        match = self.find(seq)
        if not match:
            return None
        if self.dec.config.auto_gamma:
            profile = self.profile("lookup")
            limit = self.lookup_limit(seq)
            self.rate = round_rate(profile, self.method, self.rates_for("lookup"), self.slim_sorts, limit)
            if self.rate * profile.verify(1) <= 1.0:
                return None
        return "lookup"

    def propose(self, seq: list[int], gamma: int) -> tuple[list[int], None]:
        return self.find(seq)[:gamma], None


class Hybrid(PromptLookup):
    """Prompt lookup when it has a match that pays (with gamma="auto": that pays more than the model drafter's round
    at its own acceptance in this run), else the model drafter."""

    name = "hybrid"

    def __init__(self, dec, base_profile, vocab: int, method: str, slim_sorts: bool, model: Drafter):
        super().__init__(dec, base_profile, vocab, method, slim_sorts)
        self.model, self.chosen = model, "model"
        self.profiles["model"] = model.profile("model")
        self.rounds, self.unmatched = 0, 0  # rounds asked, and those lookup had no paying match for

    def source(self, seq: list[int]) -> str | None:
        """With gamma="auto", the fastest of a lookup round, a model round and an AR step (predicted tokens per ms)."""
        lookup = super().source(seq)
        self.rounds, self.unmatched = self.rounds + 1, self.unmatched + (lookup is None)
        if not self.dec.config.auto_gamma:
            self.chosen = lookup or "model"
            return self.chosen
        rates = {"lookup": self.rate} if lookup else {}
        rates.update({"model": self.model_rate(seq), None: 1.0 / self.profile("model").verify(1)})
        choice = max(rates, key=rates.get)  # ties: lookup, then the model
        self.chosen = choice or "model"
        return choice

    def model_rate(self, seq: list[int]) -> float:
        """A model round's tokens per ms; until the model drafter has read the prompt, that read is paid by the tokens
        it is expected to draft in the rest of the run (the share of rounds so far that lookup left to it, from a
        prior of one in two): on an answer that copies, a long prompt's read is not worth a few model rounds."""
        rate = round_rate(self.profile("model"), self.method, self.rates_for("model"), self.slim_sorts)
        unread = self.dec.prompt_tokens - self.model.reader.seen
        if unread <= 0:
            return rate
        remaining = self.dec.config.max_new_tokens - (len(seq) - self.dec.prompt_tokens)
        tokens = max(remaining * (self.unmatched + 1) / (self.rounds + 2), 1.0)
        return 1.0 / (1.0 / rate + self.profile("model").prompt("drafter", unread) / tokens)

    def limit(self, seq: list[int]) -> int:
        return self.lookup_limit(seq) if self.chosen == "lookup" else MAX_GAMMA

    def propose(self, seq: list[int], gamma: int):
        """Drafts from the part the last `source` call picked."""
        return super().propose(seq, gamma) if self.chosen == "lookup" else self.model.propose(seq, gamma)


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


def drafter_profiles(pair, base, exit_layer: int = 0) -> dict:
    """{drafter: the pair's cost profile with that drafter's cost per token}: what gamma="auto" prices rounds with
    (`python -m via_sd profile` prints their c)."""
    layer = exit_layer or default_exit_layer(pair.verifier.config.num_hidden_layers)
    return {"model": base, "lookup": replace(base, draft_ms=(lookup_ms(LOOKUP_NGRAM, LOOKUP_TOKENS),) * 3),
            f"early-exit-{layer}": replace(base, draft_ms=exit_draft_ms(pair, layer))}


def describe(config, pair) -> str:
    """What drafted, in words (the trace's models.drafter)."""
    kind = config.drafter
    lookup_words = f"prompt lookup (n-gram <= {config.lookup_ngram}, <= {config.lookup_tokens} tokens)"
    if kind == "lookup":
        return lookup_words
    if kind == "hybrid":
        return f"{lookup_words}, else {pair.drafter_name}"
    if kind == "early-exit":
        n = pair.verifier.config.num_hidden_layers
        return f"{pair.verifier_name}, early exit after layer {exit_layer_of(config, pair.verifier)} of {n}"
    return pair.drafter_name


def exit_caches(pair, config, method: str, start, device):
    """(the early-exit drafter's cache, the full verifier's cache or None): in SD one network split at the exit,
    its two views; in VIA-SD (whose verifiers share their own trunk) a cache of the exit's own."""
    from .cached import CachedModel

    layer, vocab = exit_layer_of(config, pair.verifier), pair.vocab_size
    if method == "sd":
        both = start(("early-exit", layer), lambda: early_exit_verifier(pair.verifier, layer, vocab, device))
        return both.view("slim"), both.view("full")
    net = EarlyExitNet(pair.verifier, layer)
    return start(("early-exit-own", layer), lambda: CachedModel(net, vocab, net.device, device)), None


def make_drafter(dec, kind: str, pair, method: str, reader) -> Drafter:
    """The run's drafter: `reader` reads the model that drafts (the pair's drafter, or the early exit)."""
    base = pair.costs
    if kind == "early-exit":
        return EarlyExit(dec, reader, base, exit_draft_ms(pair, exit_layer_of(dec.config, pair.verifier)))
    model = Drafter(dec, reader, base)
    if kind == "lookup":
        return PromptLookup(dec, base, pair.vocab_size, method, dec.slim_sorts)
    if kind == "hybrid":
        return Hybrid(dec, base, pair.vocab_size, method, dec.slim_sorts, model)
    return model
