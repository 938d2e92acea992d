"""The fields of a trace (schema `via-sd-trace/1`): what each may hold, one spec per field, that `check_trace`
checks a parsed trace with and `trace_check.json_schema` writes as JSON Schema (docs/api.md). A trace that fails
raises `TraceError` (a ValueError) with one message naming the field:

    not a VIA-SD trace: summary.tokens_per_s must be a finite number >= 0, got nan

Fields the schema names are checked strictly (times and counts finite and non-negative,
probabilities in [0, 1], tiers / decisions / outcomes / signals / methods from their known sets,
strings bounded, settings within `bounds.BOUNDS`). Keys it does not name (newer engine versions add
some) are accepted when they are plain JSON within the same bounds: finite numbers, bounded strings,
bounded nesting; a name that says what the number is (`*_ms`, `*_calls`, `*_rate`, `*_share`, ...)
gets that range too. Plain Python: nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .bounds import BOUNDS

SCHEMA = "via-sd-trace/1"
METHODS = ("ar", "sd", "via")
TIERS = ("draft", "slim", "full")
OUTCOMES = ("kept", "replaced", "bonus")
DECISIONS = ("accepted", "kept", "replaced", "discarded")  # "pending" exists only in live events
SIGNALS = ("slim", "draft")
DRAFTER_KINDS = ("model", "lookup", "hybrid", "early-exit")  # config.drafter, models.drafter_kind

MAX_DEPTH = 12  # a trace is 5 deep (top -> rounds -> round -> candidates -> candidate)
MAX_ITEMS = 200_000  # tokens, rounds, token ids; candidates per round: MAX_CANDIDATES
MAX_CANDIDATES = 4096
MAX_KEYS = 256  # keys of one object
MAX_TEXT = 2_000_000  # prompt and output text
MAX_TOKEN_TEXT = 1_000  # one token's text
MAX_NAME = 1_000  # method, device, model names, any string the schema does not name
MAX_INT = 2**53  # JSON numbers beyond this are not exact in JavaScript
_SURROGATE = re.compile("[\ud800-\udfff]")


class TraceError(ValueError):
    """A trace refused at the gate; the message names the field."""


def _fail(path: str, what: str, value=None, show: bool = True) -> None:
    got = f", got {_show(value)}" if show else ""
    raise TraceError(f"not a VIA-SD trace: {path} {what}{got}")


def _show(value) -> str:
    if isinstance(value, (dict, list)):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


# ---- field checks --------------------------------------------------------------------------------

def _number(path, v, lo=0.0, hi=float(MAX_INT), integer=False, optional=False):
    if v is None and optional:
        return
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    finite = ok_type and (isinstance(v, int) or math.isfinite(v))  # isfinite(10**400) would overflow
    if isinstance(v, bool) or not finite or not lo <= v <= hi:
        kind = "an integer" if integer else "a finite number"
        if hi >= 1e12:  # an upper bound only against absurd values: not worth a mention
            bounds = f" >= {lo:g}" if lo > -1e12 else ""
        else:
            bounds = f" in [{lo:g}, {hi:g}]" if not integer else f" in [{lo:,}, {hi:,}]"
        _fail(path, f"must be {kind}{bounds}" + (" or null" if optional else ""), v)


def _string(path, v, limit=MAX_NAME, optional=False):
    if v is None and optional:
        return
    if not isinstance(v, str):
        _fail(path, "must be a string" + (" or null" if optional else ""), v)
    if len(v) > limit:
        _fail(path, f"is {len(v):,} characters long; at most {limit:,}", show=False)
    if _SURROGATE.search(v) is not None:  # from a JSON escape such as "\ud800": no UTF-8 text can hold it
        _fail(path, "holds a lone surrogate (an escape such as \\ud800 that is no character)", show=False)


def _choice(path, v, allowed, optional=False):
    if v is None and optional:
        return
    if not isinstance(v, str) or v not in allowed:
        _fail(path, f"must be one of {', '.join(allowed)}" + (" or null" if optional else ""), v)


def _flag(path, v):
    if not isinstance(v, bool):
        _fail(path, "must be true or false", v)


def _object(path, v, optional=False):
    if v is None and optional:
        return False
    if not isinstance(v, dict):
        _fail(path, "must be a JSON object", v)
    if len(v) > MAX_KEYS:
        _fail(path, f"has {len(v):,} keys; at most {MAX_KEYS}", show=False)
    return True


def _list(path, v, limit=MAX_ITEMS):
    if not isinstance(v, list):
        _fail(path, "must be a list", v)
    if len(v) > limit:
        _fail(path, f"has {len(v):,} entries; at most {limit:,}", show=False)


_NONNEG_SUFFIXES = ("_ms", "_s", "_calls", "_count", "_counts", "_tokens", "tokens", "_drafted", "_per_token",
                    "_per_s", "_length")
_UNIT_SUFFIXES = ("_rate", "_share", "_fraction", "_agreement")


def _generic(path: str, v, depth: int) -> None:
    """A value the schema does not name: plain JSON within bounds; the key's suffix may give a range."""
    if depth > MAX_DEPTH:
        _fail(path, f"is nested more than {MAX_DEPTH} deep", show=False)
    if v is None or isinstance(v, bool):
        return
    key = path.rsplit(".", 1)[-1]
    if isinstance(v, (int, float)):
        big = MAX_INT  # beyond it no number is a measurement (nor exact in JavaScript)
        if key.endswith(_UNIT_SUFFIXES):
            _number(path, v, 0.0, 1.0)
        elif key.endswith(_NONNEG_SUFFIXES):
            _number(path, v, 0.0, big)
        else:
            _number(path, v, -big, big)
    elif isinstance(v, str):
        _string(path, v)
    elif isinstance(v, list):
        _list(path, v)
        for n, item in enumerate(v):
            _generic(f"{path}[{n}]", item, depth + 1)
    elif isinstance(v, dict):
        _object(path, v)
        for k, item in v.items():
            _generic(f"{path}.{_key(path, k)}", item, depth + 1)
    else:
        _fail(path, "must be plain JSON", v)


def _key(path: str, k) -> str:
    if not isinstance(k, str) or len(k) > 100 or _SURROGATE.search(k) is not None:
        _fail(path, "has a key that is not a short string", k)
    return k


def _fields(path: str, obj: dict, known: dict, depth: int, required=()) -> None:
    """Check `obj`'s known keys with their checkers and every other key generically."""
    for k in required:
        if k not in obj:
            _fail(path or "the trace", f"lacks the field {k!r}", show=False)
    for k, v in obj.items():
        sub = f"{path}.{_key(path, k)}" if path else _key("the trace", k)
        if k in known:
            known[k].check(sub, v)
        else:
            _generic(sub, v, depth + 1)


# ---- the schema: what each field allows, checked here and written as JSON Schema (docs/api.md) ----------

class Spec:
    """What a field allows: `check(path, value)` raises TraceError naming the field; `schema(defs)` says the same as
    JSON Schema (a spec with a `ref` is written once, under $defs, and referred to)."""

    ref: str | None = None

    def check(self, path: str, value) -> None:
        raise NotImplementedError

    def json(self, defs: dict) -> dict:
        raise NotImplementedError

    def schema(self, defs: dict) -> dict:
        if self.ref is None:
            return self.json(defs)
        if self.ref not in defs:
            defs[self.ref] = None  # its place: written in the order a reader meets them
            defs[self.ref] = self.json(defs)
        return {"$ref": f"#/$defs/{self.ref}"}


def _plain(x):
    """0.0 -> 0, 1e12 -> 1000000000000: a bound as JSON writes it plainly."""
    return int(x) if isinstance(x, float) and x.is_integer() and abs(x) <= MAX_INT else x


def _or_null(schema: dict, optional: bool) -> dict:
    return {**schema, "type": [schema["type"], "null"]} if optional else schema


@dataclass(frozen=True)
class Number(Spec):
    lo: float = 0.0
    hi: float = float(MAX_INT)
    integer: bool = False
    optional: bool = False
    ref: str | None = None

    def check(self, path, v):
        _number(path, v, self.lo, self.hi, self.integer, self.optional)

    def json(self, defs):
        kind = "integer" if self.integer else "number"
        return _or_null({"type": kind, "minimum": _plain(self.lo), "maximum": _plain(self.hi)}, self.optional)


def setting(name: str, optional: bool = False) -> Number:
    """A setting `DecodeConfig` takes: the bounds it was made within (`bounds.BOUNDS`)."""
    bound = BOUNDS[name]
    return Number(bound.lo, bound.hi, bound.whole, optional)


@dataclass(frozen=True)
class Text(Spec):
    limit: int = MAX_NAME
    optional: bool = False

    def check(self, path, v):
        _string(path, v, self.limit, self.optional)

    def json(self, defs):
        return _or_null({"type": "string", "maxLength": self.limit}, self.optional)


@dataclass(frozen=True)
class Choice(Spec):
    allowed: tuple
    optional: bool = False

    def check(self, path, v):
        _choice(path, v, self.allowed, self.optional)

    def json(self, defs):
        return {"enum": [*self.allowed, None] if self.optional else list(self.allowed)}


class Flag(Spec):
    def check(self, path, v):
        _flag(path, v)

    def json(self, defs):
        return {"type": "boolean"}


@dataclass(frozen=True)
class Each(Spec):
    item: Spec
    limit: int = MAX_ITEMS

    def check(self, path, v):
        _list(path, v, self.limit)
        for n, item in enumerate(v):
            self.item.check(f"{path}[{n}]", item)

    def json(self, defs):
        return {"type": "array", "maxItems": self.limit, "items": self.item.schema(defs)}


@dataclass(frozen=True)
class Obj(Spec):
    """An object: its named fields checked by their specs, any other key as plain JSON within bounds (`_generic`)."""

    fields: dict
    depth: int  # how deep in the trace it sits (bounds the nesting of keys the schema does not name)
    required: tuple = ()
    optional: bool = False
    ref: str | None = None

    def check(self, path, v):
        if _object(path, v, self.optional):
            _fields(path, v, self.fields, self.depth, self.required)

    def json(self, defs):
        schema = {"type": "object", "properties": {k: spec.schema(defs) for k, spec in self.fields.items()}}
        if self.required:
            schema["required"] = list(self.required)
        return _or_null(schema, self.optional)


class Ordered(Obj):
    """The thresholds: escalate at most accept."""

    def check(self, path, v):
        super().check(path, v)
        if v is not None and v["escalate"] > v["accept"]:
            _fail(f"{path}.escalate", f"must not exceed accept ({v['accept']})", v["escalate"])

    def json(self, defs):
        return {**super().json(defs), "description": "escalate <= accept"}


@dataclass(frozen=True)
class AutoOr(Spec):
    """"auto" or a number (drafts per round: chosen each round by the cost model, or fixed)."""

    number: Number

    def check(self, path, v):
        if v != "auto":
            self.number.check(path, v)

    def json(self, defs):
        return {"anyOf": [{"const": "auto"}, self.number.schema(defs)]}


COUNT = Number(0, MAX_INT, integer=True, ref="count")
COUNT_OR_NULL = Number(0, MAX_INT, integer=True, optional=True, ref="count_or_null")
MS = Number(0.0, 1e12, ref="ms")
PROB = Number(0.0, 1.0)
AT_LEAST_0 = Number(0.0, ref="at_least_0")
PROB_OR_NULL = Number(0.0, 1.0, optional=True, ref="probability_or_null")
ITEMS, CANDIDATES, LAYERS = (Number(0, n, integer=True) for n in (MAX_ITEMS, MAX_CANDIDATES, 4096))

THRESHOLDS = Ordered({"accept": setting("accept"), "escalate": setting("escalate"), "signal": Choice(SIGNALS)}, 3,
                     required=("accept", "escalate"), optional=True, ref="thresholds")
CONFIG = Obj({"gamma": AutoOr(LAYERS), "max_new_tokens": ITEMS, "temperature": setting("temperature"),
              "top_p": PROB_OR_NULL, "seed": setting("seed", optional=True), "thresholds": THRESHOLDS,
              "draft_stop": PROB_OR_NULL, "chat": Flag(), "progressive": Flag(), "max_unverified": ITEMS,
              "slim_cache": Choice(("own", "full")), "reuse_opening": Flag(), "drafter": Choice(DRAFTER_KINDS),
              "lookup_ngram": setting("lookup_ngram"), "lookup_tokens": setting("lookup_tokens"),
              "exit_layer": LAYERS}, 1, ref="config")
MODEL_NAMES = Obj({"drafter": Text(optional=True), "verifier": Text(optional=True), "route": Text(optional=True),
              "drafter_kind": Choice(DRAFTER_KINDS), "skipped": Each(Text(), MAX_CANDIDATES),
              "skip_fraction": PROB_OR_NULL}, 1, ref="models")
TOKEN = Obj({"i": ITEMS, "id": COUNT_OR_NULL, "text": Text(MAX_TOKEN_TEXT), "round": ITEMS, "tier": Choice(TIERS),
             "outcome": Choice(OUTCOMES), "p_draft": PROB_OR_NULL, "q_slim": PROB_OR_NULL, "q_full": PROB_OR_NULL,
             "confidence": PROB_OR_NULL}, 2, required=("text", "tier", "round"), ref="token")
CANDIDATE = Obj({"pos": CANDIDATES, "token": COUNT, "text": Text(MAX_TOKEN_TEXT), "p_draft": PROB_OR_NULL,
                 "q_slim": PROB_OR_NULL, "q_full": PROB_OR_NULL, "confidence": PROB_OR_NULL,
                 "slim_top": COUNT_OR_NULL, "full_top": COUNT_OR_NULL, "tier": Choice(TIERS, optional=True),
                 "decision": Choice(DECISIONS)}, 4, required=("pos", "decision"), ref="candidate")
CALL = Obj({"model": Choice(("drafter", "slim", "full")), "rows": ITEMS, "past": ITEMS, "resume": Flag(),
            "prompt": Flag(), "ms": MS}, 4, required=("model", "rows"), ref="call")
ROUND = Obj({"round": ITEMS, "full_called": Flag(), "slim_called": Flag(), "gamma": LAYERS,
             "calls": Each(CALL, MAX_CANDIDATES), "forced_by": Choice(("max_unverified",), optional=True),
             "candidates": Each(CANDIDATE, MAX_CANDIDATES),
             **{f"{phase}_ms": MS for phase in ("start", "draft", "slim", "full", "other")}},
            2, required=("round", "candidates"), ref="round")
SUMMARY = Obj({**dict.fromkeys(("new_tokens", "drafted", "full_calls", "slim_calls", "prompt_tokens",
                                "opening_tokens"), COUNT),
               "prefill_ms": MS, "wall_ms": MS,
               **dict.fromkeys(("tokens_per_s", "mean_accepted_length", "full_calls_per_token"), AT_LEAST_0),
               "rejection_rate": PROB, "stopped": Flag(),
               "tier_counts": Obj(dict.fromkeys(TIERS, COUNT), 2)}, 1, ref="summary")
TRACE = Obj({"schema": Choice((SCHEMA,)),  # checked first, by check_trace
             "method": Choice(METHODS), "prompt": Text(MAX_TEXT), "text": Text(MAX_TEXT), "token_ids": Each(COUNT),
             "models": MODEL_NAMES, "device": Text(), "dtype": Text(), "config": CONFIG, "tokens": Each(TOKEN),
             "rounds": Each(ROUND), "summary": SUMMARY}, 0, required=("schema", "method", "prompt", "tokens", "rounds",
                                                                      "summary"))


def check_trace(data, prefix: str = "") -> None:
    """Raise TraceError naming the first field of `data` (a parsed trace) that breaks the schema."""
    if not isinstance(data, dict):
        raise TraceError(f"not a VIA-SD trace: {prefix or 'the file'} holds {_show(data)}, not a trace object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TraceError(f"not a VIA-SD trace: {prefix}schema must be {SCHEMA!r}, got {_show(schema)}")
    try:
        _fields(prefix.rstrip("."), data, TRACE.fields, 0, required=TRACE.required)
    except RecursionError:  # only reachable for a dict built in Python, never from parsed JSON
        raise TraceError(f"not a VIA-SD trace: {prefix or 'the trace'} is nested too deeply") from None
