"""Trace: every emitted token, every drafted candidate, every round, and their timings.

The Trace is the contract between the engine and the pictures (schema `via-sd-trace/1`).
Tokens, rounds and candidates are plain dicts so that the JSON round trip is exact.

tokens[i]:   i, id, text, round, tier (draft|slim|full), outcome (kept|replaced|bonus),
             p_draft, q_slim, q_full (None where that model did not score it), confidence
costs:       the pair's cost profile on the machine that ran it (via_sd.cost.model.CostProfile.to_dict())
models:      drafter (who drafted, in words: the drafter model's name, or prompt lookup / early exit), drafter_kind
             (model | lookup | hybrid | early-exit; absent in older traces: model), verifier, route, ...
rounds[k]:   round, gamma (drafts asked for), drafter (who drafted this round: model | lookup | early-exit, None for
             a round with no drafts; absent in older traces), start_ms, draft_ms, slim_ms, full_ms, other_ms,
             full_called, slim_called,
             forced_by (None, or "max_unverified": tier A was closed this round because that many tokens in
             a row had been kept with no verifier), calls[] (every forward: model, rows fed, rows already
             cached, resume: a full pass that resumed from the slim pass's shared sub-layers, prompt: a read
             of the prompt), candidates[]
candidate:   pos, token, text, p_draft, q_slim, q_full, slim_top, full_top (the verifiers' top choices
             where they scored the position), confidence, tier,
             decision (accepted: tier A, no verifier | kept: a verifier agreed |
                       replaced: a verifier emitted another token | discarded: after a replacement)
summary:     new_tokens, wall_ms, tokens_per_s, mean_accepted_length, rejection_rate (the paper's: tier-A
             drafts count as accepted), verified_rejection_rate (among drafts a verifier checked),
             unverified_share (tokens kept with no verifier), exact_share (tokens the full verifier decided:
             only these are exact; "draft" and "slim" tokens are not), drafted, full_calls, slim_calls,
             tier_counts, first_token_ms (time to the first decided token: the end of the first round that emitted
             one, from the call's start), acceptance_by_position (per draft position 0, 1, ...: the share of the
             drafts made there that were kept, by tier A or a verifier, as vLLM's per-position acceptance), predicted_tokens_per_s (the recorded forwards priced with
             `costs`), prompt_tokens,
             opening_tokens (of those, the chat opening every cache started with: via_sd.core.opening), ...
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from .trace_check import load_trace_json

SCHEMA = "via-sd-trace/1"
KEPT_DECISIONS = ("accepted", "kept")
VERIFIED_DECISIONS = ("kept", "replaced")  # a verifier checked the draft


@dataclass
class Trace:
    method: str
    prompt: str
    text: str = ""
    token_ids: list = field(default_factory=list)
    models: dict = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"
    config: dict = field(default_factory=dict)
    tokens: list = field(default_factory=list)
    rounds: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)  # the cost profile the run was decided and priced with (costs.py)
    schema: str = SCHEMA

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "Trace":
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a VIA-SD trace: expected schema {SCHEMA!r}, found {found!r}")
        missing = [k for k in ("method", "prompt", "tokens", "rounds", "summary") if k not in data]
        if missing:
            raise ValueError(f"not a VIA-SD trace: missing {', '.join(missing)}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(load_trace_json(text))  # the gate: size and depth, then every field (trace_check)

    def candidates(self) -> list[dict]:
        """Every drafted candidate of every round, each with its round number."""
        return [dict(c, round=r["round"]) for r in self.rounds for c in r["candidates"]]

    def to_csv(self) -> str:
        """One row per emitted token (the trace table)."""
        out = io.StringIO()
        cols = ["i", "id", "text", "round", "tier", "outcome", "p_draft", "q_slim", "q_full", "confidence"]
        writer = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.tokens)
        return out.getvalue()


class Tally:
    """Running counts for the summary block, updated once per round: O(1) amortized per token."""

    def __init__(self):
        self.tokens = self.rounds = self.drafted = self.kept = self.checked = self.replaced = 0
        self.full_calls = self.slim_calls = 0
        self.tier_counts = {tier: 0 for tier in ("draft", "slim", "full")}
        self.first_token_ms = None  # the end of the first round that emitted a token
        self.at_position: list[list[int]] = []  # per draft position: [drafted, kept]

    def add(self, rnd: dict, tokens: list[dict]) -> None:
        """One recorded round and the tokens it emitted."""
        if tokens and self.first_token_ms is None:
            self.first_token_ms = round_end_ms(rnd)
        self.rounds += 1
        self.full_calls += int(rnd["full_called"])
        self.slim_calls += int(rnd.get("slim_called", False))
        for c in rnd["candidates"]:
            self.drafted += 1
            self.kept += c["decision"] in KEPT_DECISIONS
            self.checked += c["decision"] in VERIFIED_DECISIONS
            self.replaced += c["decision"] == "replaced"
            pos = c.get("pos", 0)  # a draft discarded after a replacement counts as not kept, as in vLLM
            while len(self.at_position) <= pos:
                self.at_position.append([0, 0])
            self.at_position[pos][0] += 1
            self.at_position[pos][1] += c["decision"] in KEPT_DECISIONS
        for t in tokens:
            self.tokens += 1
            self.tier_counts[t["tier"]] += 1

    def summary(self, prefill_ms: float, wall_ms: float) -> dict:
        n = self.tokens
        decode_ms = max(wall_ms - prefill_ms, 1e-9)
        return {
            "new_tokens": n,
            "prefill_ms": prefill_ms,
            "wall_ms": wall_ms,
            "tokens_per_s": 1000.0 * n / decode_ms if n else 0.0,
            "mean_accepted_length": n / self.rounds if self.rounds else 0.0,
            # as the paper counts it: tier-A drafts (kept with no verifier) count as accepted
            "rejection_rate": 1.0 - self.kept / self.drafted if self.drafted else 0.0,
            # among the drafts a verifier checked (slim or full): like with like against plain SD
            "verified_rejection_rate": self.replaced / self.checked if self.checked else 0.0,
            "unverified_share": self.tier_counts["draft"] / n if n else 0.0,
            # exact tokens: the full verifier decided them (tier "full"); tiers "draft" and "slim" are not
            "exact_share": self.tier_counts["full"] / n if n else 0.0,
            "drafted": self.drafted,
            "full_calls": self.full_calls,
            "full_calls_per_token": self.full_calls / n if n else 0.0,
            "slim_calls": self.slim_calls,
            "tier_counts": dict(self.tier_counts),
            "first_token_ms": self.first_token_ms,
            # vLLM's per-position acceptance: of the drafts made at each position, the share kept
            "acceptance_by_position": [kept / drafted if drafted else None for drafted, kept in self.at_position],
        }


def round_end_ms(rnd: dict) -> float | None:
    """When a recorded round ended, from the call's start (its tokens are decided then); None in a trace without
    round timings."""
    if rnd.get("start_ms") is None:
        return None
    return rnd["start_ms"] + sum(rnd.get(f"{phase}_ms") or 0.0 for phase in ("draft", "slim", "full", "other"))


def summarize(tokens: list[dict], rounds: list[dict], prefill_ms: float, wall_ms: float) -> dict:
    """The summary block of a whole trace; `tokens_per_s` counts decode time (wall minus prefill; the
    engine folds prompt processing into round 0, so its prefill_ms is 0 and round 0 carries the prompt's cost)."""
    tally = Tally()
    for r in rounds:
        tally.add(r, ())
    for t in tokens:
        tally.tokens += 1
        tally.tier_counts[t["tier"]] += 1
    first = next((r for r in rounds if tokens and r["round"] == tokens[0]["round"]), None)
    tally.first_token_ms = round_end_ms(first) if first else None
    return tally.summary(prefill_ms, wall_ms)
