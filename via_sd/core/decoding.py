"""Autoregressive, speculative (two-tier) and VIA-SD (three-tier) decoding, in one loop shape.

Every method runs the same round: the drafter (drafters.py: the model, prompt lookup, a hybrid or the
verifier's early exit) proposes up to gamma tokens (none for AR; none is an AR step), a verifier step
decides which to keep, the caches roll back to what was kept, the round is recorded. Who verifies:

    verify_ar   the full verifier emits one token
    verify_sd   the full verifier checks every draft (lossless rejection sampling)
    verify_via  each draft is sorted by confidence into tier A (kept as drafted), tier B (the slim
                verifier decides) or tier C (the full verifier checks it and every later draft)

Each model keeps its own KV cache and catches up lazily on tokens it has not seen, so the full
verifier runs only in rounds that escalate to it. In VIA-SD the slim and full verifier share the
sub-layers before the route's first skip (progressive verification, progressive.ProgressiveVerifier):
one KV cache there, and a full pass resumes from the hidden states the slim pass left.
How many drafts a round has: `DecodeConfig(gamma="auto")` (the default) asks the cost model
(costs.best_gamma) each round, from the pair's measured cost profile (pair.costs, the drafter's c) and the
acceptance and tier shares seen so far in this run; every round records its gamma and every forward it made,
and the summary prices those forwards (`predicted_tokens_per_s`, next to the measured `tokens_per_s`).
`stream_events` yields an Event after drafting, after each tier's decisions and after each round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import torch

from .cached import CachedModel, Clock, Reader, drafter_cache
from .config import DecodeConfig
from ..cost.model import best_gamma, call_ms
from .drafters import check_signal, describe, exit_caches, make_drafter
from .pair import ModelPair
from .plan import DRAFT, FULL, SLIM, force_verification, plan_round, slim_sorts, tier_of, unverified_run
from .progressive import ProgressiveVerifier
from .text import TokenText
from .sampling import logits_to_probs, pick, relative_confidence, verify_draft
from .record import Emitted, Round, candidates, record_round, until_eos
from .trace import Tally, Trace

METHODS = ("ar", "sd", "via")


def verifier_cache(pair: ModelPair, prompt_ids: list[int], reuse_opening: bool = True) -> CachedModel:
    """The full verifier with a KV cache of its own (logits on the drafter's device), started from the pair's read
    chat opening unless `reuse_opening` is False: what the decoders verify with, and fidelity scores with."""
    def fresh():
        return CachedModel(pair.verifier, pair.vocab_size, pair.slim.device, pair.drafter.device)

    return pair.openings.start("full", fresh, prompt_ids) if reuse_opening else fresh()


class Decoder:
    """State shared by the three methods: the pair, caches, sampling, clock, and the round's size."""

    def __init__(self, pair: ModelPair, config: DecodeConfig, clock: Clock, method: str, prompt_ids: list[int]):
        self.pair, self.config, self.clock, self.method = pair, config, clock, method
        self.device = pair.drafter.device  # where probabilities are compared and sampled
        self.calls: list = []  # the current round's forwards (Reader appends; the loop hands them to the Round)
        vocab, route = pair.vocab_size, tuple(pair.route.skip)

        def start(key, fresh, module=None):  # a fresh cache, or a copy of one that read the chat opening
            return pair.openings.start(key, fresh, prompt_ids, module) if config.reuse_opening else fresh()

        drafter = start("drafter", lambda: drafter_cache(pair.drafter, vocab, pair.drafter.device, self.device),
                        pair.drafter)
        kind, full = (config.drafter if method != "ar" else "model"), None
        if kind == "early-exit":  # in SD the exit's cache is the verifier's for the shared layers
            drafter, full = exit_caches(pair, config, method, start, self.device)
        if method == "via" and config.progressive:  # slim and full share the sub-layers before the first skip
            verifiers = start(("progressive", route, config.slim_cache), lambda: ProgressiveVerifier(
                pair.slim, vocab, self.device, slim_cache=config.slim_cache))
            slim, full = verifiers.view("slim"), verifiers.view("full")
        else:
            slim = start(("slim", route), lambda: CachedModel(pair.slim, vocab, pair.slim.device, self.device))
            full = full or verifier_cache(pair, prompt_ids, config.reuse_opening)
        self.opening = min(m.seen for m in (drafter, slim, full))  # prompt tokens every cache started with
        prompt = self.prompt_tokens = len(prompt_ids)
        self.drafter, self.slim, self.full = (Reader(m, name, prompt, self.calls) for m, name in
                                              ((drafter, "drafter"), (slim, "slim"), (full, "full")))
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.slim_sorts = slim_sorts(method, config.thresholds)
        self.drafting = make_drafter(self, kind, pair, method, self.drafter)  # drafters.py: who proposes tokens
        self.source = None  # who drafts this round (drafters.Drafter.source)

    def gamma(self, remaining: int, seq: list[int]) -> int:
        """This round's draft length: fixed, or the one the cost profile predicts is fastest now for the drafter that
        drafts it; 0 for an AR step: nothing to propose (prompt lookup without a match), or, in SD with gamma="auto",
        the round that reads the prompt (read in a call of its own, cached.Reader, its drafts would cost a second
        pass, V(g), for what the next round checks at V(g + 1) - V(g) over an AR step; VIA-SD's tiers decide theirs)."""
        self.source = None if self.method == "ar" else self.drafting.source(seq)
        if self.method == "sd" and len(seq) == self.prompt_tokens and self.config.auto_gamma:
            self.source = None  # (prompt lookup still observes the round)
        if self.source is None:
            return 0
        if not self.config.auto_gamma:
            return min(self.config.gamma, remaining)
        method = "sd" if self.method == "sd" or self.config.thresholds.fixed_tier == FULL else "via"
        profile, rates = self.drafting.profile(self.source), self.drafting.rates_for(self.source)
        return min(best_gamma(profile, method, rates, self.slim_sorts, limit=self.drafting.limit(seq)), remaining)

    def learn(self, rnd: Round, lag: int, start: int, emitted: list[int]) -> None:
        """What the round (from sequence length `start`) tells the drafter (acceptance, tier shares, lag)."""
        if self.source is not None:
            rejected = any(c.decision == "replaced" for c in rnd.candidates)
            self.drafting.learn(self.source, rnd.kept_drafts, rejected, rnd.sorted_tiers,
                                lag if rnd.full_called else None)
        self.drafting.observe(start, emitted)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.config.temperature, self.config.top_p)

    def timed(self, rnd: Round, phase: str, fn):
        start = self.clock.ms()
        out = fn()
        rnd.phase_ms[phase] += self.clock.ms() - start
        return out

    def draft(self, seq: list[int], gamma: int, rnd: Round) -> tuple[list[int], torch.Tensor | None]:
        """The round's drafter proposes up to `gamma` tokens, with distributions p (one-hot where it has none)."""
        if not gamma:
            return [], None
        tokens, p = self.timed(rnd, "draft", lambda: self.drafting.propose(seq, gamma))
        if p is None and tokens:
            p = torch.zeros(len(tokens), self.pair.vocab_size, device=self.device)
            p[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return tokens, p

    def score(self, model: CachedModel, phase: str, seq: list[int], drafts: list[int], start: int, stop: int,
              rnd: Round) -> tuple[torch.Tensor, list[float]]:
        """One pass of `model` fed up to drafts[:stop]: its distributions at draft positions start..stop
        (row k scores draft start+k; the last row is the position after drafts[stop-1], the bonus position
        when stop = len(drafts)), and r for drafts[start:stop]; records q(x) and the top choices."""
        rnd.ran(phase)
        ext = seq + drafts[:stop]
        q = self.timed(rnd, phase, lambda: self.probs(model.logits(ext, len(ext), stop - start + 1)))
        r, q_x, top = relative_confidence(q[:-1], torch.tensor(drafts[start:stop], device=q.device, dtype=torch.long))
        for k, (qx, t) in enumerate(zip(q_x.tolist(), top.tolist())):
            rnd.candidates[start + k].scored_by(phase, qx, t)
        return q, r.tolist()

    def check(self, rnd: Round, tier: str, drafts: list[int], p, q, start: int) -> None:
        """Standard speculative check of drafts[start:] against q (q[k] scores position start+k);
        a replacement ends the round, otherwise the bonus token comes from q's last row."""
        for k in range(len(drafts) - start):
            if not self.check_one(rnd, tier, drafts, p, q[k], start + k):
                return
        self.bonus(rnd, tier, q[-1])

    def check_one(self, rnd: Round, tier: str, drafts: list[int], p, q_row: torch.Tensor, i: int) -> bool:
        """The speculative check of draft i against one verifier row; True if the draft was kept."""
        kept, out = verify_draft(drafts[i], p[i], q_row, self.config.greedy, self.generator)
        self.decide(rnd, i, out, tier, "kept" if kept else "replaced", p).scored_by(tier, float(q_row[out]))
        return kept

    def decide(self, rnd: Round, i: int, token: int, tier: str, outcome: str, p) -> Emitted:
        """Records tier `tier`'s decision on candidate i and the token it emits there (a kept draft carries what
        the verifiers said of it)."""
        cand = rnd.candidates[i]
        cand.tier = tier
        cand.decision = "accepted" if tier == DRAFT else outcome
        rnd.kept_drafts += outcome == "kept"
        kept = outcome == "kept"
        rnd.emitted.append(Emitted(token, tier, outcome, float(p[i][token]), cand.q_slim if kept else None,
                                   cand.q_full if kept else None, cand.confidence))
        return rnd.emitted[-1]

    def bonus(self, rnd: Round, tier: str, q_row: torch.Tensor) -> None:
        """The verifier that ran last adds one token of its own after the kept drafts."""
        token = pick(q_row, self.config.greedy, self.generator)
        rnd.emitted.append(Emitted(token, tier, "bonus").scored_by(tier, float(q_row[token])))


# Each verify_* decides the round's drafts and yields after each group of decisions (for live views).

def verify_ar(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> Iterator[None]:
    """Autoregressive: the full verifier alone emits one token."""
    rnd.full_called = True
    q = dec.timed(rnd, "full", lambda: dec.probs(dec.full.logits(seq, len(seq), 1)))
    dec.bonus(rnd, FULL, q[0])
    yield from ()  # no drafts to announce


def verify_sd(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> Iterator[None]:
    """Speculative decoding: the full verifier checks every draft in one parallel pass."""
    rnd.sorted_tiers = [FULL] * len(drafts)
    q, _ = dec.score(dec.full, FULL, seq, drafts, 0, len(drafts), rnd)
    dec.check(rnd, FULL, drafts, p, q, 0)
    yield


def verify_via(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> Iterator[None]:
    """VIA-SD: tier A keeps the draft, tier B asks the slim verifier, tier C defers to the full one, in the
    order the round plan (plan.py) gives; each verifier runs at most once a round."""
    th, n, cands = dec.config.thresholds, len(drafts), rnd.candidates
    q_slim, offset = None, 0
    if dec.slim_sorts:
        q_slim, confidence = dec.score(dec.slim, SLIM, seq, drafts, 0, n, rnd)
    elif th.signal == "slim":  # the thresholds alone decide every tier: no slim pass for the signal
        confidence = [None] * n
    else:
        confidence = [c.p_draft for c in cands]
    tiers = [th.fixed_tier or tier_of(r, th) for r in confidence]
    if rnd.forced_by:  # too many tokens in a row were kept unverified: a verifier sees this round
        tiers = force_verification(tiers, dec.slim_sorts)
    for c, r in zip(cands, confidence):
        c.confidence = r
    rnd.sorted_tiers = tiers
    plan = plan_round(tiers, dec.slim_sorts)
    full_from = plan.full[0] if plan.full else n

    k = 0
    while k < full_from and plan.decide[k] == DRAFT:  # tier A at once
        dec.decide(rnd, k, drafts[k], DRAFT, "kept", p)
        k += 1
    if k:
        yield
    if plan.slim is not None and q_slim is None:  # draft signal: the slim pass over its stretch only
        q_slim, _ = dec.score(dec.slim, SLIM, seq, drafts, *plan.slim, rnd)
        offset = plan.slim[0]
    decided_by_slim = False
    for k in range(k, full_from):
        if plan.decide[k] == DRAFT:
            dec.decide(rnd, k, drafts[k], DRAFT, "kept", p)
        else:
            decided_by_slim = True
            if not dec.check_one(rnd, SLIM, drafts, p, q_slim[k - offset], k):
                yield
                return
    if plan.full is None:  # the round never escalated: the bonus comes from the slim pass, if it saw that far
        if plan.bonus == SLIM:
            dec.bonus(rnd, SLIM, q_slim[-1])
        if decided_by_slim:
            yield
        return
    if decided_by_slim:
        yield
    q_full, _ = dec.score(dec.full, FULL, seq, drafts, full_from, n, rnd)
    dec.check(rnd, FULL, drafts, p, q_full, full_from)
    yield


VERIFY = {"ar": verify_ar, "sd": verify_sd, "via": verify_via}


@dataclass
class Event:
    """One step of a decode, for live views.

    kind "drafts":  the drafter has proposed this round's tokens; every candidate is "pending".
    kind "decided": a tier decided some drafts (A at once, B after the slim pass, C after the full
                    pass); decided candidates carry `tier` and `decision`, the others are "pending".
    kind "round":   the round is recorded; `trace` is the Trace so far (the last one is final).
    `candidates` are copies of the round's candidate dicts at that moment.
    """

    kind: str
    round: int
    trace: Trace
    candidates: list


class Run:
    """One decode in progress: its decoder, the growing trace and the clock (time a consumer holds an event is not
    decoding time)."""

    def __init__(self, pair: ModelPair, prompt: str, method: str, config: DecodeConfig):
        self.prompt_ids = pair.encode(prompt, chat=config.chat)
        limit = getattr(pair.verifier.config, "max_position_embeddings", None) or 32768
        if len(self.prompt_ids) + config.max_new_tokens + config.longest_round + 1 > limit:
            raise ValueError(f"the prompt is {len(self.prompt_ids)} tokens; with max_new_tokens={config.max_new_tokens} "
                             f"it exceeds the verifier's context of {limit} tokens: shorten the prompt")
        check_signal(config.drafter, method, config.thresholds.signal)
        self.pair, self.method, self.config = pair, method, config
        self.clock = Clock(pair.drafter.device)
        self.dec = Decoder(pair, config, self.clock, method, self.prompt_ids)  # reads the chat opening once per pair
        # the pair's cost profile (measured once per machine and pair, via_sd.core.profile), the drafter's c in it
        self.profile = self.dec.drafting.costs
        models = {**pair.describe(), "drafter": describe(config, pair), "drafter_kind": self.dec.drafting.name}
        self.trace = Trace(method=method, prompt=prompt, models=models, device=str(pair.slim.device),
                           dtype=str(pair.dtype).replace("torch.", ""), config=config.to_dict(),
                           costs=self.profile.to_dict())
        self.text, self.tally = TokenText(pair.tokenizer), Tally()
        self.seq = list(self.prompt_ids)
        self.start, self.paused = self.clock.ms(), 0.0
        self.unverified = 0  # tokens in a row kept as drafted since a verifier last checked one (max_unverified)
        self.priced_ms = 0.0  # the recorded forwards priced by the cost profile (predicted_tokens_per_s)

    def hand_over(self, event: Event) -> Iterator[Event]:
        """Yields `event`; the time the consumer holds it counts as paused, not as decoding."""
        handed = self.clock.ms()
        yield event
        self.paused += self.clock.ms() - handed

    def round(self) -> Iterator[Event]:
        """One round, as gpt-fast's speculative_decode: draft, let the method's verifier step decide (an event after
        drafting and after each group of decisions), roll every cache back to what was kept, record. Returns True
        when the run is over (token budget or end of text)."""
        dec, trace, k = self.dec, self.trace, len(self.trace.rounds)
        round_start, paused_before = self.clock.ms(), self.paused
        remaining = self.config.max_new_tokens - len(trace.tokens)
        # dec.gamma picks who drafts this round (dec.source) and how many tokens
        rnd = Round(gamma=dec.gamma(remaining, self.seq), forced_by=self.forced_by(), drafter=dec.source)
        # tokens past the prompt the full verifier has yet to catch up on (it reads the prompt in a call of its own)
        lag = len(self.seq) - max(dec.full.seen, len(self.prompt_ids))
        drafts, p = dec.draft(self.seq, rnd.gamma, rnd)
        rnd.candidates = candidates(drafts, p, self.pair.tokenizer)
        steps = VERIFY[self.method if drafts else "ar"](dec, self.seq, drafts, p, rnd)  # no drafts: an AR step
        if drafts:
            yield from self.hand_over(Event("drafts", k, trace, [asdict(c) for c in rnd.candidates]))
        for _ in steps:
            yield from self.hand_over(Event("decided", k, trace, [asdict(c) for c in rnd.candidates]))
        emitted = until_eos(rnd.emitted[:remaining], self.pair.eos_ids)
        start = len(self.seq)
        self.keep(rnd, emitted)
        dec.learn(rnd, lag, start, [tok.id for tok in emitted])
        held = self.paused - paused_before
        record_round(trace, rnd, emitted, self.text, self.tally, round_start - self.start - paused_before,
                     self.clock.ms() - round_start - held)
        self.priced_ms += sum(call_ms(self.profile, c) for c in rnd.calls)  # this round's forwards, priced once
        trace.token_ids, trace.text = self.seq[len(self.prompt_ids):], self.text.text
        return len(emitted) >= remaining or emitted[-1].id in self.pair.eos_ids

    def forced_by(self) -> str | None:
        """"max_unverified" when too many tokens in a row were kept with no verifier: this round must verify."""
        bound = self.config.max_unverified
        return "max_unverified" if self.method == "via" and bound and self.unverified >= bound else None

    def keep(self, rnd: Round, emitted: list[Emitted]) -> None:
        """Every cache rolls back to what all of them may keep; the sequence takes the emitted tokens."""
        valid = len(self.seq) + min(rnd.kept_drafts, len(emitted))
        for model in (self.dec.drafter, self.dec.slim, self.dec.full):
            model.rollback(valid)
        self.seq.extend(tok.id for tok in emitted)
        self.unverified = unverified_run(self.unverified, [(tok.tier, tok.outcome) for tok in emitted])
        rnd.calls = list(self.dec.calls)
        self.dec.calls.clear()

    def summary(self, **extra) -> dict:
        # No separate prefill: each model reads the prompt with its first call of round 0, so prefill_ms is 0.
        wall = self.clock.ms() - self.start - self.paused
        predicted = 1000.0 * len(self.trace.tokens) / self.priced_ms if self.priced_ms else 0.0
        return {**self.tally.summary(0.0, wall), "prompt_tokens": len(self.prompt_ids),
                "opening_tokens": self.dec.opening, "predicted_tokens_per_s": predicted, **extra}

    def finish(self, stopped: bool) -> Event:
        """The last event: the text settled, the final summary."""
        for i, piece in self.text.flush().items():
            self.trace.tokens[i]["text"] = piece
        self.trace.text = self.text.text
        self.trace.summary = self.summary(stopped=stopped)
        rounds = self.trace.rounds
        return Event("round", len(rounds) - 1, self.trace, rounds[-1]["candidates"] if rounds else [])


def stream_events(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
                  stop=None) -> Iterator[Event]:
    """Decodes round by round, yielding an Event after drafting, after each tier's decisions and after each recorded
    round (time the consumer holds an event is not decoding time). `stop`: anything with `is_set()` (a
    threading.Event), checked between rounds."""
    config = DecodeConfig() if config is None else config
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a via_sd.DecodeConfig, got {type(config).__name__}: "
                         "build one with DecodeConfig(gamma=..., max_new_tokens=...)")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: type some text for the model to continue")
    run, stopped = Run(pair, prompt, method, config), False
    while True:
        if stop is not None and stop.is_set():
            stopped = True
            break
        if (yield from run.round()):  # the token budget or end of text
            break
        run.trace.summary = run.summary()
        yield from run.hand_over(Event("round", len(run.trace.rounds) - 1, run.trace,
                                       run.trace.rounds[-1]["candidates"]))
    yield run.finish(stopped)


def stream(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
           stop=None) -> Iterator[Trace]:
    """Decodes round by round, yielding the trace so far after each round (the last one is final); `stop` as in
    stream_events."""
    for event in stream_events(pair, prompt, method, config, stop=stop):
        if event.kind == "round":
            yield event.trace


def generate(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
             on_round=None, stop=None) -> Trace:
    """Decodes `prompt` with "ar", "sd" or "via" and returns the full Trace; `on_round(trace)` is called after every
    round with the trace so far."""
    trace = None
    for trace in stream(pair, prompt, method, config, stop=stop):
        if on_round is not None:
            on_round(trace)
    return trace
