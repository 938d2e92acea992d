"""Trace: every emitted token, every drafted candidate, every round, and their timings.

The Trace is the contract between the engine and the pictures (schema `via-sd-trace/1`).
Tokens, rounds and candidates are plain dicts so that the JSON round trip is exact.

tokens[i]:   i, id, text, round, tier (draft|slim|full), outcome (kept|replaced|bonus),
             p_draft, q_slim, q_full (None where that model did not score it), confidence
rounds[k]:   round, start_ms, draft_ms, slim_ms, full_ms, other_ms, full_called, slim_called, candidates[]
candidate:   pos, token, text, p_draft, q_slim, q_full, slim_top, full_top (the verifiers' top choices
             where they scored the position), confidence, tier,
             decision (accepted: tier A, no verifier | kept: a verifier agreed |
                       replaced: a verifier emitted another token | discarded: after a replacement)
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

SCHEMA = "via-sd-trace/1"
KEPT_DECISIONS = ("accepted", "kept")


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
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not a VIA-SD trace: invalid JSON ({err})") from None
        return cls.from_dict(data)

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


def summarize(tokens: list[dict], rounds: list[dict], prefill_ms: float, wall_ms: float) -> dict:
    """The summary block; `tokens_per_s` counts decode time (wall minus prefill; the engine folds
    prompt processing into round 0, so its prefill_ms is 0 and round 0 carries the prompt's cost)."""
    candidates = [c for r in rounds for c in r["candidates"]]
    kept = sum(c["decision"] in KEPT_DECISIONS for c in candidates)
    n = len(tokens)
    decode_ms = max(wall_ms - prefill_ms, 1e-9)
    full_calls = sum(int(r["full_called"]) for r in rounds)
    tier_counts = {tier: 0 for tier in ("draft", "slim", "full")}
    for t in tokens:
        tier_counts[t["tier"]] += 1
    return {
        "new_tokens": n,
        "prefill_ms": prefill_ms,
        "wall_ms": wall_ms,
        "tokens_per_s": 1000.0 * n / decode_ms if n else 0.0,
        "mean_accepted_length": n / len(rounds) if rounds else 0.0,
        "rejection_rate": 1.0 - kept / len(candidates) if candidates else 0.0,
        "drafted": len(candidates),
        "full_calls": full_calls,
        "full_calls_per_token": full_calls / n if n else 0.0,
        "slim_calls": sum(int(r.get("slim_called", False)) for r in rounds),
        "tier_counts": tier_counts,
    }
