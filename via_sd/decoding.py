"""Autoregressive, speculative (two-tier) and VIA-SD (three-tier) decoding, in one loop shape.

Every method runs the same round: the drafter proposes up to gamma tokens (none for AR), a
verifier step decides which to keep, the caches roll back to what was kept, the round is
recorded. What differs is who verifies:

    verify_ar   the full verifier emits one token
    verify_sd   the full verifier checks every draft (lossless rejection sampling)
    verify_via  each draft is sorted by confidence into tier A (kept as drafted), tier B (the slim
                verifier decides) or tier C (the full verifier checks it and every later draft)

Each model keeps its own KV cache and catches up lazily on tokens it has not seen, so the full
verifier runs only in rounds that escalate to it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache

from .models import ModelPair
from .tiers import (DRAFT, FULL, SLIM, Thresholds, logits_to_probs, pick, relative_confidence, tier_of,
                    verify_draft)
from .trace import Trace, summarize

METHODS = ("ar", "sd", "via")
MAX_NEW_TOKENS = 4096


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

    def __post_init__(self):
        if not isinstance(self.gamma, int) or not 1 <= self.gamma <= 64:
            raise ValueError(f"gamma (draft length) must be a whole number from 1 to 64, got {self.gamma!r}")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be from 1 to {MAX_NEW_TOKENS}, got {self.max_new_tokens!r}")
        if not 0.0 <= self.temperature <= 5.0:
            raise ValueError(f"temperature must lie in [0, 5] (0 = greedy), got {self.temperature!r}")
        if not 0.0 <= self.draft_stop <= 1.0:
            raise ValueError(f"draft_stop must lie in [0, 1] (0 = always draft gamma tokens), got {self.draft_stop!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.thresholds, Thresholds):
            raise ValueError("thresholds must be a via_sd.Thresholds")

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
    """One model with its own KV cache, and how many tokens of the sequence that cache holds."""

    def __init__(self, forward, vocab_size: int, input_device, output_device):
        self.forward = forward
        self.vocab_size = vocab_size
        self.input_device, self.output_device = input_device, output_device
        self.cache = DynamicCache()
        self.seen = 0

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
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
    phase_ms: dict = field(default_factory=lambda: {"draft": 0.0, "slim": 0.0, "full": 0.0})


class Decoder:
    """State shared by the three methods: the pair, caches, sampling, clock."""

    def __init__(self, pair: ModelPair, config: DecodeConfig, clock: Clock):
        self.pair, self.config, self.clock = pair, config, clock
        self.device = pair.drafter.device  # where probabilities are compared and sampled
        vocab = pair.vocab_size
        self.drafter = CachedModel(pair.drafter, vocab, pair.drafter.device, self.device)
        self.slim = CachedModel(pair.slim, vocab, pair.slim.device, self.device)
        self.full = CachedModel(pair.verifier, vocab, pair.slim.device, self.device)
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

    def score(self, model: CachedModel, phase: str, seq: list[int], drafts: list[int], from_pos: int,
              rnd: Round) -> tuple[torch.Tensor, list[float]]:
        """Distributions of `model` at draft positions from_pos..n (the last one is the bonus position),
        and each candidate's relative confidence r under it; records q(x) and the top choice."""
        setattr(rnd, f"{phase}_called", True)
        ext, keep = seq + drafts, len(drafts) - from_pos + 1
        q = self.timed(rnd, phase, lambda: self.probs(model.logits(ext, len(ext), keep)))
        r, q_x, top = relative_confidence(q[:-1], torch.tensor(drafts[from_pos:], device=q.device, dtype=torch.long))
        for k, (qx, t) in enumerate(zip(q_x.tolist(), top.tolist())):
            rnd.candidates[from_pos + k].update({f"q_{phase}": qx, f"{phase}_top": t})
        return q, r.tolist()

    def check(self, rnd: Round, tier: str, drafts: list[int], p, q, from_pos: int) -> None:
        """Standard speculative check of drafts[from_pos:] against q (q[k] scores position from_pos+k);
        a replacement ends the round, otherwise the bonus token comes from q's last row."""
        key = "q_slim" if tier == SLIM else "q_full"
        for k, token in enumerate(drafts[from_pos:]):
            i = from_pos + k
            kept, out = verify_draft(token, p[i], q[k], self.config.greedy, self.generator)
            self.decide(rnd, i, out, tier, "kept" if kept else "replaced", p, {key: float(q[k][out])})
            if not kept:
                return
        self.bonus(rnd, tier, q[-1])

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
        key = "q_slim" if tier == SLIM else "q_full"
        rnd.emitted.append({"id": token, "tier": tier, "outcome": "bonus", "p_draft": None, "q_slim": None,
                            "q_full": None, key: float(q_row[token]), "confidence": None})


def _candidates(drafts: list[int], p: torch.Tensor | None, tier: str | None = None) -> list[dict]:
    """One record per drafted token; "discarded" until a tier decides it."""
    if not drafts:
        return []
    p_draft = p[torch.arange(len(drafts)), torch.tensor(drafts, device=p.device)].tolist()
    return [{"pos": i, "token": t, "p_draft": pd, "q_slim": None, "q_full": None, "slim_top": None,
             "full_top": None, "confidence": None, "tier": tier, "decision": "discarded"}
            for i, (t, pd) in enumerate(zip(drafts, p_draft))]


def verify_ar(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> None:
    """Autoregressive: the full verifier alone emits one token."""
    rnd.full_called = True
    q = dec.timed(rnd, "full", lambda: dec.probs(dec.full.logits(seq, len(seq), 1)))
    dec.bonus(rnd, FULL, q[0])


def verify_sd(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> None:
    """Speculative decoding: the full verifier checks every draft in one parallel pass."""
    rnd.candidates = _candidates(drafts, p, FULL)
    q, _ = dec.score(dec.full, "full", seq, drafts, 0, rnd)
    dec.check(rnd, FULL, drafts, p, q, 0)


def verify_via(dec: Decoder, seq: list[int], drafts, p, rnd: Round) -> None:
    """VIA-SD: tier A keeps the draft, tier B asks the slim verifier, tier C defers to the full one."""
    th = dec.config.thresholds
    cands = rnd.candidates = _candidates(drafts, p)
    q_slim = None
    if th.signal == "slim":
        q_slim, confidence = dec.score(dec.slim, "slim", seq, drafts, 0, rnd)
    else:
        confidence = [c["p_draft"] for c in cands]
    tiers = [tier_of(r, th) for r in confidence]
    for c, r, t in zip(cands, confidence, tiers):
        c["confidence"], c["tier"] = r, t
    first_full = tiers.index(FULL) if FULL in tiers else len(drafts)
    if q_slim is None and SLIM in tiers[:first_full]:  # the draft signal pays for the slim pass only when needed
        q_slim, _ = dec.score(dec.slim, "slim", seq, drafts, 0, rnd)

    for i in range(first_full):
        if tiers[i] == DRAFT:
            dec.decide(rnd, i, drafts[i], DRAFT, "kept", p, {})
            continue
        kept, out = verify_draft(drafts[i], p[i], q_slim[i], dec.config.greedy, dec.generator)
        dec.decide(rnd, i, out, SLIM, "kept" if kept else "replaced", p, {"q_slim": float(q_slim[i][out])})
        if not kept:
            return
    if first_full < len(drafts):
        q_full, _ = dec.score(dec.full, "full", seq, drafts, first_full, rnd)
        dec.check(rnd, FULL, drafts, p, q_full, first_full)
    elif q_slim is not None:  # the round never escalated: the bonus comes from the slim verifier
        dec.bonus(rnd, SLIM, q_slim[-1])


VERIFY = {"ar": verify_ar, "sd": verify_sd, "via": verify_via}


class TokenText:
    """Splits the decoded text over tokens so the pieces always concatenate to the whole text."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd") or not full.startswith(self.text):
            return ""  # an incomplete multi-byte character: its text arrives with a later token
        piece, self.text = full[len(self.text):], full
        return piece

    def flush(self) -> str:
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        piece = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += piece
        return piece


def stream(pair: ModelPair, prompt: str, method: str = "via", config: DecodeConfig | None = None,
           stop=None) -> Iterator[Trace]:
    """Decodes round by round, yielding the trace so far after each round (the last one is final).

    `stop`: anything with `is_set()` (a threading.Event); checked between rounds.
    """
    config = config or DecodeConfig()
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
    dec = Decoder(pair, config, clock)
    verify = VERIFY[method]
    trace = Trace(method=method, prompt=prompt, models=pair.describe(), device=str(pair.slim.device),
                  dtype=str(pair.dtype).replace("torch.", ""), config=config.to_dict())
    text = TokenText(pair.tokenizer)
    seq, eos = list(prompt_ids), pair.eos_ids
    start, paused = clock.ms(), 0.0  # paused: time the consumer held the stream between rounds

    def summary(**extra) -> dict:
        wall = clock.ms() - start - paused
        return {**summarize(trace.tokens, trace.rounds, prefill_ms, wall), "prompt_tokens": len(prompt_ids), **extra}

    # No separate prefill: each model reads the prompt with its first call of the first round, so the
    # prompt costs no extra forward pass (its time is part of round 0; prefill_ms stays 0).
    prefill_ms = 0.0
    stopped = False
    while True:
        if stop is not None and stop.is_set():
            stopped = True
            break
        round_start = clock.ms()
        rnd = Round()
        remaining = config.max_new_tokens - len(trace.tokens)
        drafts, p = dec.draft(seq, 0 if method == "ar" else min(config.gamma, remaining), rnd)
        verify(dec, seq, drafts, p, rnd)
        emitted = _until_eos(rnd.emitted[:remaining], eos)
        valid = len(seq) + min(rnd.kept_drafts, len(emitted))  # what every cache may keep
        for model in (dec.drafter, dec.slim, dec.full):
            model.rollback(valid)
        seq.extend(tok["id"] for tok in emitted)
        _record_round(trace, rnd, emitted, text, pair.tokenizer, round_start - start, clock.ms() - round_start)
        trace.token_ids, trace.text = seq[len(prompt_ids):], text.text
        if len(emitted) >= remaining or emitted[-1]["id"] in eos:
            break
        trace.summary = summary()
        handed_over = clock.ms()
        yield trace
        paused += clock.ms() - handed_over
    if trace.tokens:
        trace.tokens[-1]["text"] += text.flush()
    trace.text = text.text
    trace.summary = summary(stopped=stopped)
    yield trace


def _until_eos(emitted: list[dict], eos: set[int]) -> list[dict]:
    for n, tok in enumerate(emitted):
        if tok["id"] in eos:
            return emitted[: n + 1]
    return emitted


def _record_round(trace: Trace, rnd: Round, emitted: list[dict], text: TokenText, tokenizer, start_ms: float,
                  total_ms: float) -> None:
    k = len(trace.rounds)
    for tok in emitted:
        trace.tokens.append({"i": len(trace.tokens), "id": tok["id"], "text": text.add(tok["id"]), "round": k,
                             **{f: tok[f] for f in ("tier", "outcome", "p_draft", "q_slim", "q_full", "confidence")}})
    for c in rnd.candidates:
        c["text"] = tokenizer.decode([c["token"]])
    ph = rnd.phase_ms
    trace.rounds.append({"round": k, "start_ms": start_ms, "draft_ms": ph["draft"], "slim_ms": ph["slim"],
                         "full_ms": ph["full"], "other_ms": max(total_ms - sum(ph.values()), 0.0),
                         "full_called": rnd.full_called, "slim_called": rnd.slim_called,
                         "candidates": rnd.candidates})


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
