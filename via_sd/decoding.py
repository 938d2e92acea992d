"""Autoregressive, speculative (two-tier) and VIA-SD (three-tier) decoding, in one loop shape.

Every method runs the same round: the drafter proposes up to gamma tokens (none for AR), a
verifier step decides which to keep, the caches roll back to what was kept, the round is
recorded. What differs is who verifies:

    verify_ar   the full verifier emits one token
    verify_sd   the full verifier checks every draft (lossless rejection sampling)
    verify_via  each draft is sorted by confidence into tier A (kept as drafted), tier B (the slim
                verifier decides) or tier C (the full verifier checks it and every later draft)

Each model keeps its own KV cache and catches up lazily on tokens it has not seen, so the full
verifier runs only in rounds that escalate to it. In VIA-SD the slim and full verifier share the
sub-layers before the route's first skip (progressive verification, routing.ProgressiveVerifier):
one KV cache there, and a full pass resumes from the hidden states the slim pass left.
`stream_events` yields an Event after drafting, after each tier's decisions and after each round;
`stream` and `generate` are built on it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache

from .models import ModelPair
from .routing import ProgressiveVerifier
from .tiers import (DRAFT, FULL, SLIM, Thresholds, logits_to_probs, pick, relative_confidence, tier_of,
                    verify_draft)
from .trace import Tally, Trace

METHODS = ("ar", "sd", "via")
MAX_NEW_TOKENS = 4096
MIN_TEMPERATURE = 1e-3  # below this, sampling is argmax to float precision and logits / temperature can overflow


@dataclass(frozen=True)
class DecodeConfig:
    gamma: int = 5
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    thresholds: Thresholds = field(default_factory=Thresholds)
    draft_stop: float = 0.0  # end the round's drafting early once the drafter's p(x) falls below this
    chat: bool = True  # wrap the prompt in the tokenizer's chat template when it has one
    # VIA-SD: once this many tokens in a row were kept with no verifier, the next round's drafts go to a
    # verifier (tier A is closed for that round); 0 = no bound
    max_unverified: int = 32
    # VIA-SD: the slim and full verifier share the sub-layers before the route's first skip (one KV cache,
    # a full pass resumes from the slim pass's hidden states); False runs them separately (for comparison)
    progressive: bool = True

    def __post_init__(self):
        for name in ("gamma", "max_new_tokens", "seed", "max_unverified"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be a whole number (int), got {value!r}")
        for name in ("temperature", "top_p", "draft_stop"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not 1 <= self.gamma <= 64:
            raise ValueError(f"gamma (draft length) must be a whole number from 1 to 64, got {self.gamma!r}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be from 1 to {MAX_NEW_TOKENS}, got {self.max_new_tokens!r}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {self.seed!r}")
        if not 0.0 <= self.temperature <= 5.0:
            raise ValueError(f"temperature must lie in [0, 5] (0 = greedy), got {self.temperature!r}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature!r} is so small that logits overflow: use 0 for greedy "
                             f"decoding or at least {MIN_TEMPERATURE}")
        if not 0.0 <= self.draft_stop <= 1.0:
            raise ValueError(f"draft_stop must lie in [0, 1] (0 = always draft gamma tokens), got {self.draft_stop!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.max_unverified < 0:
            raise ValueError(f"max_unverified must be 0 (no bound) or a positive number of tokens, "
                             f"got {self.max_unverified!r}")
        if not isinstance(self.thresholds, Thresholds):
            raise ValueError(f"thresholds must be a via_sd.Thresholds, got {type(self.thresholds).__name__}: "
                             "use Thresholds(accept=..., escalate=..., signal=...) or Thresholds.preset(name)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["thresholds"] = self.thresholds.to_dict()
        return d


class Clock:
    """Milliseconds since start; synchronizes CUDA first so GPU work is really finished."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        if self.cuda:  # every GPU: a verifier may be spread over several
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
        return (time.perf_counter() - self.t0) * 1000.0


class CachedModel:
    """One model with its own KV cache, and how many tokens of the sequence that cache holds.

    `prompt`: the prompt's length. A first call that reads past the prompt reads the prompt alone
    first, as AR's first call does, so every later position is fed as a pass extending the cache (with
    row attention, bit for bit what one-token steps compute: greedy SD == greedy AR)."""

    def __init__(self, forward, vocab_size: int, input_device, output_device, prompt: int = 0):
        self.forward = forward
        self.vocab_size = vocab_size
        self.input_device, self.output_device = input_device, output_device
        self.cache = DynamicCache()
        self.seen, self.prompt = 0, prompt

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
        self.rollback(upto - keep)  # a position asked for again is fed again
        if self.seen < self.prompt < upto:
            inside = max(0, self.prompt - max(upto - keep, self.seen))  # asked-for positions in the prompt
            first = self._feed(seq, self.prompt, max(inside, 1))
            return torch.cat([first[first.shape[0] - inside:], self._feed(seq, upto, keep - inside)])
        return self._feed(seq, upto, keep)

    def _feed(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        ids = torch.tensor([seq[self.seen:upto]], device=self.input_device)
        out = self.forward(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.seen = upto
        # a verifier spread over several GPUs returns logits on its last one
        return out.logits[0, -keep:, : self.vocab_size].to(self.output_device)

    def rollback(self, length: int) -> None:
        """Forgets every cached token past `length`."""
        if self.seen > length:
            self.cache.crop(length - self.seen)
            self.seen = length


@dataclass
class Round:
    """What one verification step decided: every candidate, the emitted tokens, who ran, how long."""

    candidates: list = field(default_factory=list)
    emitted: list = field(default_factory=list)  # token dicts without i/text/round
    kept_drafts: int = 0
    slim_called: bool = False
    full_called: bool = False
    forced_by: str | None = None  # "max_unverified": tier A is closed this round
    sorted_tiers: list = field(default_factory=list)  # the tier each draft was sorted into
    phase_ms: dict = field(default_factory=lambda: {"draft": 0.0, "slim": 0.0, "full": 0.0})


class Decoder:
    """State shared by the three methods: the pair, caches, sampling, clock."""

    def __init__(self, pair: ModelPair, config: DecodeConfig, clock: Clock, method: str, prompt: int = 0):
        self.pair, self.config, self.clock = pair, config, clock
        self.device = pair.drafter.device  # where probabilities are compared and sampled
        vocab = pair.vocab_size
        self.drafter = CachedModel(pair.drafter, vocab, pair.drafter.device, self.device)
        if method == "via" and config.progressive:  # slim and full share the sub-layers before the first skip
            verifiers = ProgressiveVerifier(pair.slim, vocab, self.device)
            self.slim, self.full = verifiers.view("slim"), verifiers.view("full")
        else:
            self.slim = CachedModel(pair.slim, vocab, pair.slim.device, self.device)
            self.full = CachedModel(pair.verifier, vocab, pair.slim.device, self.device, prompt=prompt)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.config.temperature, self.config.top_p)

    def timed(self, rnd: Round, phase: str, fn):
        start = self.clock.ms()
        out = fn()
        rnd.phase_ms[phase] += self.clock.ms() - start
        return out

    def draft(self, seq: list[int], gamma: int, rnd: Round) -> tuple[list[int], torch.Tensor]:
        """The drafter proposes `gamma` tokens one by one; returns them and their distributions p."""

        def run():
            tokens, dists, ext = [], [], list(seq)
            for _ in range(gamma):
                p = self.probs(self.drafter.logits(ext, len(ext), 1)[0])
                token = pick(p, self.config.greedy, self.generator)
                tokens.append(token)
                dists.append(p)
                ext.append(token)
                if float(p[token]) < self.config.draft_stop:  # an unsure drafter wastes the next drafts
                    break
            return tokens, torch.stack(dists)

        return self.timed(rnd, "draft", run) if gamma else ([], None)

    def score(self, model: CachedModel, phase: str, seq: list[int], drafts: list[int], start: int, stop: int,
              rnd: Round) -> tuple[torch.Tensor, list[float]]:
        """One pass of `model` fed up to drafts[:stop]: its distributions at draft positions start..stop
        (row k scores draft start+k; the last row is the position after drafts[stop-1], the bonus position
        when stop = len(drafts)), and r for drafts[start:stop]; records q(x) and the top choices."""
        setattr(rnd, f"{phase}_called", True)
        ext = seq + drafts[:stop]
        q = self.timed(rnd, phase, lambda: self.probs(model.logits(ext, len(ext), stop - start + 1)))
        r, q_x, top = relative_confidence(q[:-1], torch.tensor(drafts[start:stop], device=q.device, dtype=torch.long))
        for k, (qx, t) in enumerate(zip(q_x.tolist(), top.tolist())):
            rnd.candidates[start + k].update({f"q_{phase}": qx, f"{phase}_top": t})
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
        self.decide(rnd, i, out, tier, "kept" if kept else "replaced", p, {f"q_{tier}": float(q_row[out])})
        return kept

    def decide(self, rnd: Round, i: int, token: int, tier: str, outcome: str, p, scores: dict) -> None:
        """Records tier `tier`'s decision on candidate i and the token it emits there."""
        cand = rnd.candidates[i]
        cand["tier"] = tier
        cand["decision"] = "accepted" if tier == DRAFT else outcome
        rnd.kept_drafts += outcome == "kept"
        kept_scores = {"q_slim": cand["q_slim"], "q_full": cand["q_full"]} if outcome == "kept" else {}
        rnd.emitted.append({"id": token, "tier": tier, "outcome": outcome, "p_draft": float(p[i][token]),
                            "q_slim": None, "q_full": None, **kept_scores, **scores,
                            "confidence": cand["confidence"]})

    def bonus(self, rnd: Round, tier: str, q_row: torch.Tensor) -> None:
        """The verifier that ran last adds one token of its own after the kept drafts."""
        token = pick(q_row, self.config.greedy, self.generator)
        rnd.emitted.append({"id": token, "tier": tier, "outcome": "bonus", "p_draft": None, "q_slim": None,
                            "q_full": None, f"q_{tier}": float(q_row[token]), "confidence": None})


def _candidates(drafts: list[int], p: torch.Tensor | None, tokenizer) -> list[dict]:
    """One record per drafted token; "pending" until a tier decides it."""
    if not drafts:
        return []
    p_draft = p[torch.arange(len(drafts)), torch.tensor(drafts, device=p.device)].tolist()
    return [{"pos": i, "token": t, "text": tokenizer.decode([t]), "p_draft": pd, "q_slim": None, "q_full": None,
             "slim_top": None, "full_top": None, "confidence": None, "tier": None, "decision": "pending"}
            for i, (t, pd) in enumerate(zip(drafts, p_draft))]


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
    """VIA-SD: tier A keeps the draft, tier B asks the slim verifier, tier C defers to the full one.

    Each verifier runs at most once a round, over the positions it must decide. Slim signal: the slim
    pass sorts every draft, the full pass checks from the first tier-C draft. Draft signal: a round with
    a tier-C draft runs the full pass alone, from the first draft that is not tier A (it decides tier B
    exactly, at no extra cost); otherwise the slim pass runs up to the last tier-B draft.
    """
    th, n, cands = dec.config.thresholds, len(drafts), rnd.candidates
    q_slim = None
    if th.signal == "slim" and th.fixed_tier is None:
        q_slim, confidence = dec.score(dec.slim, SLIM, seq, drafts, 0, n, rnd)
    elif th.signal == "slim":  # the thresholds alone decide every tier: no slim pass for the signal
        confidence = [None] * n
    else:
        confidence = [c["p_draft"] for c in cands]
    tiers = [th.fixed_tier or tier_of(r, th) for r in confidence]
    if rnd.forced_by:  # too many tokens in a row were kept unverified: a verifier sees this round
        tiers = [SLIM if t == DRAFT else t for t in tiers]
    for c, r in zip(cands, confidence):
        c["confidence"] = r
    rnd.sorted_tiers = tiers

    i = 0
    while i < n and tiers[i] == DRAFT:  # tier A at once
        dec.decide(rnd, i, drafts[i], DRAFT, "kept", p, {})
        i += 1
    if i:
        yield
    if i == n:  # every draft in tier A: the bonus comes from the slim pass if one ran (no verifier otherwise)
        if q_slim is not None:
            dec.bonus(rnd, SLIM, q_slim[-1])
        return
    first_full = tiers.index(FULL) if FULL in tiers else n
    if q_slim is None and first_full < n:  # draft signal with a tier-C draft: the full pass alone
        q_full, _ = dec.score(dec.full, FULL, seq, drafts, i, n, rnd)
        dec.check(rnd, FULL, drafts, p, q_full, i)
        yield
        return
    offset = 0
    if q_slim is None:  # draft signal, tier B and no tier C: the slim pass up to the last tier-B draft
        last = max(k for k in range(n) if tiers[k] == SLIM)
        q_slim, _ = dec.score(dec.slim, SLIM, seq, drafts, i, last + 1, rnd)
        offset = i
    for k in range(i, first_full):
        if tiers[k] == DRAFT:
            dec.decide(rnd, k, drafts[k], DRAFT, "kept", p, {})
        elif not dec.check_one(rnd, SLIM, drafts, p, q_slim[k - offset], k):
            yield
            return
    if first_full == n:  # the round never escalated: the bonus comes from the slim verifier, if it saw that far
        if len(q_slim) + offset == n + 1:
            dec.bonus(rnd, SLIM, q_slim[-1])
        yield
        return
    if first_full > i:
        yield
    q_full, _ = dec.score(dec.full, FULL, seq, drafts, first_full, n, rnd)
    dec.check(rnd, FULL, drafts, p, q_full, first_full)
    yield


VERIFY = {"ar": verify_ar, "sd": verify_sd, "via": verify_via}


class TokenText:
    """Each token's piece of the decoded text, O(1) amortized per token.

    Decodes a short window of recent tokens without and with the new one and emits the difference,
    as streaming servers do (the window's own start-of-text effects cancel out). A token whose text is
    not yet complete (half of a multi-byte character) waits and its text arrives with a later token.
    When a tokenizer rewrites text already handed out (cleaned-up spaces), `rewrite` fixes the pieces
    inside the window; `flush` decodes everything once at the end and `resync`s if anything still
    differs, so the pieces always concatenate to `tokenizer.decode(ids, skip_special_tokens=True)`.
    """

    WINDOW = 4  # settled tokens decoded again as context for the next piece

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.pieces = tokenizer, [], []
        self.settled = 0  # tokens whose text has been handed out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add(self, token_id: int) -> dict[int, str]:
        """Appends a token; returns {token index: its text} for every piece that changed."""
        self.ids.append(token_id)
        self.pieces.append("")
        start = max(self.settled - self.WINDOW, 0)
        before, after = self.decode(self.ids[start:self.settled]), self.decode(self.ids[start:])
        if after.endswith("\ufffd"):
            return {}  # an incomplete multi-byte character: its text arrives with a later token
        if not after.startswith(before):
            return self.rewrite(start, before, after)
        self.pieces[-1] = after[len(before):]
        self.settled = len(self.ids)
        return {len(self.ids) - 1: self.pieces[-1]}

    def rewrite(self, start: int, before: str, after: str) -> dict[int, str]:
        """The new token changed text already handed out (e.g. " n't" -> "n't"): rewrites the pieces of the
        window from the first changed character, the rest of the text going to the newest token."""
        emitted = "".join(self.pieces[start:self.settled])
        lead = len(emitted) - len(before)  # text the window's decode drops at its start (a leading space)
        if lead < 0 or emitted[lead:] != before:
            return self.resync()
        common = 0
        while common < min(len(before), len(after)) and before[common] == after[common]:
            common += 1
        pos, k = 0, start
        while pos + len(self.pieces[k]) <= lead + common and k < self.settled:
            pos += len(self.pieces[k])
            k += 1
        changed = {j: "" for j in range(k, len(self.pieces))}
        changed[len(self.pieces) - 1] = (emitted[:lead] + after)[pos:]
        for j, piece in changed.items():
            self.pieces[j] = piece
        self.settled = len(self.ids)
        return changed

    def resync(self) -> dict[int, str]:
        """Decodes everything once and rewrites the pieces from the first one that differs."""
        full = self.decode(self.ids)
        pos, i = 0, 0
        while i < len(self.pieces) and full.startswith(self.pieces[i], pos):
            pos += len(self.pieces[i])
            i += 1
        if i == len(self.pieces) and pos == len(full):
            return {}
        changed = {k: "" for k in range(i, len(self.pieces))}
        changed[len(self.pieces) - 1] = full[pos:]  # the rest of the text goes to the newest token
        for k, piece in changed.items():
            self.pieces[k] = piece
        self.settled = len(self.ids)
        return changed

    def flush(self) -> dict[int, str]:
        """Gives any waiting text to the last token and checks the whole text once."""
        return self.resync() if self.ids else {}


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


def stream_events(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
                  stop=None) -> Iterator[Event]:
    """Decodes round by round, yielding an Event after drafting, after each tier's decisions and after
    each recorded round. Time the consumer holds an event is not counted as decoding time.

    `stop`: anything with `is_set()` (a threading.Event); checked between rounds.
    """
    config = DecodeConfig() if config is None else config
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a via_sd.DecodeConfig, got {type(config).__name__}: "
                         "build one with DecodeConfig(gamma=..., max_new_tokens=...)")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: type some text for the model to continue")
    prompt_ids = pair.encode(prompt, chat=config.chat)
    limit = getattr(pair.verifier.config, "max_position_embeddings", None) or 32768
    if len(prompt_ids) + config.max_new_tokens + config.gamma + 1 > limit:
        raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with max_new_tokens={config.max_new_tokens} it "
                         f"exceeds the verifier's context of {limit} tokens: shorten the prompt")

    clock = Clock(pair.drafter.device)
    dec = Decoder(pair, config, clock, method, prompt=len(prompt_ids))
    verify = VERIFY[method]
    trace = Trace(method=method, prompt=prompt, models=pair.describe(), device=str(pair.slim.device),
                  dtype=str(pair.dtype).replace("torch.", ""), config=config.to_dict())
    text, tally = TokenText(pair.tokenizer), Tally()
    seq, eos = list(prompt_ids), pair.eos_ids
    start, paused = clock.ms(), 0.0  # paused: time the consumer held an event
    unverified = 0  # tokens in a row kept with no verifier

    def summary(**extra) -> dict:
        wall = clock.ms() - start - paused
        return {**tally.summary(prefill_ms, wall), "prompt_tokens": len(prompt_ids), **extra}

    # No separate prefill: each model reads the prompt with its first call of the first round (the full
    # verifier in a call of its own: CachedModel), so its time is part of round 0; prefill_ms stays 0.
    prefill_ms = 0.0
    stopped = False
    while True:
        if stop is not None and stop.is_set():
            stopped = True
            break
        round_start, held = clock.ms(), 0.0  # held: time the consumer kept this round's events
        round_at = round_start - start - paused
        k = len(trace.rounds)
        rnd = Round()
        if method == "via" and config.max_unverified and unverified >= config.max_unverified:
            rnd.forced_by = "max_unverified"
        remaining = config.max_new_tokens - len(trace.tokens)
        drafts, p = dec.draft(seq, 0 if method == "ar" else min(config.gamma, remaining), rnd)
        rnd.candidates = _candidates(drafts, p, pair.tokenizer)
        steps = verify(dec, seq, drafts, p, rnd)
        if drafts:
            handed_over = clock.ms()
            yield Event("drafts", k, trace, [dict(c) for c in rnd.candidates])
            held += clock.ms() - handed_over
        for _ in steps:
            handed_over = clock.ms()
            yield Event("decided", k, trace, [dict(c) for c in rnd.candidates])
            held += clock.ms() - handed_over
        paused += held
        emitted = _until_eos(rnd.emitted[:remaining], eos)
        valid = len(seq) + min(rnd.kept_drafts, len(emitted))  # what every cache may keep
        for model in (dec.drafter, dec.slim, dec.full):
            model.rollback(valid)
        seq.extend(tok["id"] for tok in emitted)
        for tok in emitted:
            unverified = unverified + 1 if tok["tier"] == DRAFT else 0
        _record_round(trace, rnd, emitted, text, tally, round_at, clock.ms() - round_start - held)
        trace.token_ids, trace.text = seq[len(prompt_ids):], text.text
        if len(emitted) >= remaining or emitted[-1]["id"] in eos:
            break
        trace.summary = summary()
        handed_over = clock.ms()
        yield Event("round", k, trace, trace.rounds[-1]["candidates"])
        paused += clock.ms() - handed_over
    for i, piece in text.flush().items():
        trace.tokens[i]["text"] = piece
    trace.text = text.text
    trace.summary = summary(stopped=stopped)
    yield Event("round", len(trace.rounds) - 1, trace, trace.rounds[-1]["candidates"] if trace.rounds else [])


def stream(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
           stop=None) -> Iterator[Trace]:
    """Decodes round by round, yielding the trace so far after each round (the last one is final).

    `stop`: anything with `is_set()` (a threading.Event); checked between rounds.
    """
    for event in stream_events(pair, prompt, method, config, stop=stop):
        if event.kind == "round":
            yield event.trace


def _until_eos(emitted: list[dict], eos: set[int]) -> list[dict]:
    for n, tok in enumerate(emitted):
        if tok["id"] in eos:
            return emitted[: n + 1]
    return emitted


def _record_round(trace: Trace, rnd: Round, emitted: list[dict], text: TokenText, tally: Tally, start_ms: float,
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
    trace.rounds.append({"round": k, "start_ms": start_ms, "draft_ms": ph["draft"], "slim_ms": ph["slim"],
                         "full_ms": ph["full"], "other_ms": max(total_ms - sum(ph.values()), 0.0),
                         "full_called": rnd.full_called, "slim_called": rnd.slim_called,
                         "forced_by": rnd.forced_by, "candidates": rnd.candidates})
    tally.add(trace.rounds[-1], new)


def generate(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
             on_round=None, stop=None) -> Trace:
    """Decodes `prompt` with "ar", "sd" or "via" and returns the full Trace.

    `on_round(trace)` is called after every round with the trace so far.
    """
    trace = None
    for trace in stream(pair, prompt, method, config, stop=stop):
        if on_round is not None:
            on_round(trace)
    return trace
