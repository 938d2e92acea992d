"""Autoregressive, speculative (two-tier) and VIA-SD (three-tier) decoding: a run of rounds, streamed.

Every method runs the same round (round.speculative_round): the drafter (drafters.py: the model, prompt lookup, a
hybrid or the verifier's early exit) proposes up to gamma tokens (none for AR; none is an AR step), a verifier step
decides which to keep; then the caches roll back to what was kept, the drafter learns what became of its drafts,
and the round is recorded and priced (here). Who verifies:

    ar   the full verifier emits one token
    sd   the full verifier checks every draft (lossless rejection sampling)
    via  each draft is sorted by confidence into tier A (kept as drafted), tier B (the slim verifier decides) or
         tier C (the full verifier checks it and every later draft)

Each model keeps its own KV cache and catches up lazily on tokens it has not seen, so the full verifier runs only in
rounds that escalate to it. In VIA-SD the slim and full verifier share the sub-layers before the route's first skip
(progressive verification, progressive.ProgressiveVerifier): one KV cache there, and a full pass resumes from the
hidden states the slim pass left. How many drafts a round has: `DecodeConfig(gamma="auto")` (the default) lets the
drafter ask the cost model (cost.model.RoundCost) each round, from the pair's measured cost profile (pair.costs, the
drafter's c) and the acceptance and tier shares seen so far in this run; every round records its gamma and every
forward it made, and the summary prices those forwards (`predicted_tokens_per_s`, next to the measured
`tokens_per_s`). `stream_events` yields an Event after drafting, after each tier's decisions and after each round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

from ..cost.model import RoundCost, call_ms
from .cached import Clock, Reader, drafter_cache, model_cache
from .config import DecodeConfig
from .drafters import check_signal, describe, exit_caches, make_drafter
from .pair import ModelPair
from .plan import FULL, slim_sorts, unverified_run
from .progressive import ProgressiveVerifier
from .proposal import Outcome
from .record import Emitted, Round, record_round, until_eos
from .round import Steps, speculative_round
from .sampling import Sampler
from .text import TokenText
from .trace import Tally, Trace

METHODS = ("ar", "sd", "via")


def verifier_cache(pair: ModelPair, prompt_ids: list[int], reuse_opening: bool = True):
    """The full verifier with a KV cache of its own (logits on the drafter's device), started from the pair's read
    chat opening unless `reuse_opening` is False: what the decoders verify with, and fidelity scores with."""
    def fresh():
        return model_cache(pair.verifier, pair.vocab_size, pair.slim.device, pair.drafter.device)

    return pair.openings.start("full", fresh, prompt_ids) if reuse_opening else fresh()


@dataclass
class Caches:
    """A run's three models, each with its KV cache, as the round reads them (cached.Reader): every forward they
    make is appended to `calls`; `opening`: the prompt tokens every cache started with (the chat opening)."""

    drafter: Reader
    slim: Reader
    full: Reader
    calls: list
    opening: int

    def rollback(self, length: int) -> None:
        for model in (self.drafter, self.slim, self.full):
            model.rollback(length)


def open_caches(pair: ModelPair, config: DecodeConfig, method: str, prompt_ids: list[int],
                clock: Clock | None = None) -> Caches:
    """Fresh caches for a run, or copies of ones that read the chat opening (opening.py); in VIA-SD the slim and
    full verifier share their trunk (progressive), in SD an early-exit drafter shares the verifier's. With a `clock`
    every recorded forward carries its milliseconds (the evidence a cost profile is corrected from)."""
    device, vocab, route = pair.drafter.device, pair.vocab_size, tuple(pair.route.skip)

    def start(key, fresh, module=None):
        return pair.openings.start(key, fresh, prompt_ids, module) if config.reuse_opening else fresh()

    drafter = start("drafter", lambda: drafter_cache(pair.drafter, vocab, pair.drafter.device, device), pair.drafter)
    full = None
    if method != "ar" and config.drafter == "early-exit":  # in SD the exit's cache is the verifier's for its layers
        drafter, full = exit_caches(pair, config, method, start, device)
    if method == "via" and config.progressive:  # slim and full share the sub-layers before the first skip
        verifiers = start(("progressive", route, config.slim_cache), lambda: ProgressiveVerifier(
            pair.slim, vocab, device, slim_cache=config.slim_cache))
        slim, full = verifiers.view("slim"), verifiers.view("full")
    else:
        slim = start(("slim", route), lambda: model_cache(pair.slim, vocab, pair.slim.device, device))
        full = full or verifier_cache(pair, prompt_ids, config.reuse_opening)
    opening = min(m.seen for m in (drafter, slim, full))
    calls, n = [], len(prompt_ids)
    return Caches(*(Reader(m, name, n, calls, clock) for m, name in ((drafter, "drafter"), (slim, "slim"), (full, "full"))),
                  calls, opening)


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
    """One decode in progress: its caches, drafter and round steps, the growing trace and the clock (time a consumer
    holds an event is not decoding time)."""

    def __init__(self, pair: ModelPair, prompt: str, method: str, config: DecodeConfig):
        self.prompt_ids = pair.encode(prompt, chat=config.chat)
        limit = getattr(pair.verifier.config, "max_position_embeddings", None) or 32768
        if len(self.prompt_ids) + config.max_new_tokens + config.longest_round + 1 > limit:
            raise ValueError(f"the prompt is {len(self.prompt_ids)} tokens; with max_new_tokens={config.max_new_tokens} "
                             f"it exceeds the verifier's context of {limit} tokens: shorten the prompt")
        check_signal(config.drafter, method, config.thresholds.signal)
        self.pair, self.method, self.config = pair, method, config
        self.clock = Clock(pair.drafter.device)
        self.caches = open_caches(pair, config, method, self.prompt_ids, self.clock)  # reads the chat opening once per pair
        sampler, sorts = Sampler(config, pair.drafter.device), slim_sorts(method, config.thresholds)
        round_cost = RoundCost.of(method, config.thresholds.fixed_tier == FULL, sorts)
        kind = config.drafter if method != "ar" else "model"
        self.drafter = make_drafter(kind, pair, config, round_cost, self.caches.drafter, sampler, len(self.prompt_ids))
        self.steps = Steps(self.drafter, self.caches.slim, self.caches.full, sampler, self.clock, method,
                           config.thresholds, sorts, pair.tokenizer, pair.vocab_size, pair.drafter.device)
        # the pair's cost profile (measured once per machine and pair, via_sd.core.profile), the drafter's c in it
        self.profile = self.drafter.costs
        models = {**pair.describe(), "drafter": describe(config, pair), "drafter_kind": self.drafter.name}
        self.trace = Trace(method=method, prompt=prompt, models=models, device=str(pair.slim.device),
                           dtype=str(pair.dtype).replace("torch.", ""), config=config.to_dict(),
                           costs=self.profile.to_dict())
        self.text, self.tally = TokenText(pair.tokenizer), Tally()
        self.seq = list(self.prompt_ids)
        self.start, self.paused = self.clock.ms(), 0.0
        self.unverified = 0  # tokens in a row kept as drafted since a verifier last checked one (max_unverified)
        self.priced_ms = 0.0  # the recorded forwards priced by the cost profile (predicted_tokens_per_s)
        self.over = False  # the token budget is spent or the text ended

    def hand_over(self, event: Event) -> Iterator[Event]:
        """Yields `event`; the time the consumer holds it counts as paused, not as decoding."""
        handed = self.clock.ms()
        yield event
        self.paused += self.clock.ms() - handed

    def round(self) -> Iterator[Event]:
        """One round: speculative_round decides it, reporting its drafts and each group of decisions (handed over
        here as events); then every cache rolls back to what was kept, the drafter learns the outcome, and the round
        is recorded and its forwards priced. Sets `over` when the run is done (token budget or end of text)."""
        trace, k, remaining = self.trace, len(self.trace.rounds), self.config.max_new_tokens - len(self.trace.tokens)
        round_start, paused_before = self.clock.ms(), self.paused
        rnd = self.steps.begin(forced_by=self.forced_by())
        # tokens past the prompt the full verifier has yet to catch up on (it reads the prompt in a call of its own)
        lag = len(self.seq) - max(self.caches.full.seen, len(self.prompt_ids))
        for kind in speculative_round(self.steps, self.seq, self.draft_limit(remaining)):
            yield from self.hand_over(Event(kind, k, trace, [asdict(c) for c in rnd.candidates]))
        emitted = until_eos(rnd.emitted[:remaining], self.pair.eos_ids)
        self.keep(rnd, emitted, lag)
        held = self.paused - paused_before
        record_round(trace, rnd, emitted, self.text, self.tally, round_start - self.start - paused_before,
                     self.clock.ms() - round_start - held)
        self.priced_ms += sum(call_ms(self.profile, c) for c in rnd.calls)  # this round's forwards, priced once
        trace.token_ids, trace.text = self.seq[len(self.prompt_ids):], self.text.text
        self.over = len(emitted) >= remaining or emitted[-1].id in self.pair.eos_ids

    def draft_limit(self, remaining: int) -> int:
        """The most drafts this round may have: the tokens left; none in AR, and none in SD's round that reads the
        prompt with gamma="auto" (read in a call of its own, cached.Reader, its drafts would cost a second pass,
        V(g), for what the next round checks at V(g + 1) - V(g) over an AR step; VIA-SD's tiers decide theirs)."""
        reads_prompt = self.method == "sd" and len(self.seq) == len(self.prompt_ids) and self.config.auto_gamma
        return 0 if self.method == "ar" or reads_prompt else remaining

    def forced_by(self) -> str | None:
        """"max_unverified" when too many tokens in a row were kept with no verifier: this round must verify."""
        bound = self.config.max_unverified
        return "max_unverified" if self.method == "via" and bound and self.unverified >= bound else None

    def keep(self, rnd: Round, emitted: list[Emitted], lag: int) -> None:
        """Every cache rolls back to what all of them may keep; the sequence takes the emitted tokens; the drafter
        learns what became of the round (the full verifier's lag where it ran)."""
        start = len(self.seq)
        self.caches.rollback(start + min(rnd.kept_drafts, len(emitted)))
        self.seq.extend(tok.id for tok in emitted)
        self.unverified = unverified_run(self.unverified, [(tok.tier, tok.outcome) for tok in emitted])
        rnd.calls = list(self.caches.calls)
        self.caches.calls.clear()
        rejected = any(c.decision == "replaced" for c in rnd.candidates)
        self.drafter.update(Outcome(rnd.drafter, rnd.kept_drafts, rejected, rnd.sorted_tiers,
                                    lag if rnd.full_called else None, start, [tok.id for tok in emitted]))

    def summary(self, **extra) -> dict:
        # No separate prefill: each model reads the prompt with its first call of round 0, so prefill_ms is 0.
        wall = self.clock.ms() - self.start - self.paused
        predicted = 1000.0 * len(self.trace.tokens) / self.priced_ms if self.priced_ms else 0.0
        return {**self.tally.summary(0.0, wall), "prompt_tokens": len(self.prompt_ids),
                "opening_tokens": self.caches.opening, "predicted_tokens_per_s": predicted, **extra}

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
        yield from run.round()
        if run.over:  # the token budget or end of text
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
