"""The one gate for traces from outside (an upload, a file, JSON text): size and nesting depth are
checked before parsing, then every field of schema `via-sd-trace/1` for type and range.

A trace that fails raises `TraceError` (a ValueError) with one message naming the field:

    not a VIA-SD trace: summary.tokens_per_s must be a finite number >= 0, got nan

Fields the schema names are checked strictly (times and counts finite and non-negative,
probabilities in [0, 1], tiers / decisions / outcomes / signals / methods from their known sets,
strings bounded). Keys it does not name (newer engine versions add some) are accepted when they
are plain JSON within the same bounds: finite numbers, bounded strings, bounded nesting; a name
that says what the number is (`*_ms`, `*_calls`, `*_rate`, `*_share`, ...) gets that range too.
Nothing here imports torch: the app and `viz` use it on traces no model made.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from .config import BOUNDS

SCHEMA = "via-sd-trace/1"
METHODS = ("ar", "sd", "via")
TIERS = ("draft", "slim", "full")
OUTCOMES = ("kept", "replaced", "bonus")
DECISIONS = ("accepted", "kept", "replaced", "discarded")  # "pending" exists only in live events
SIGNALS = ("slim", "draft")
DRAFTER_KINDS = ("model", "lookup", "hybrid", "early-exit")  # config.drafter, models.drafter_kind

MAX_JSON_BYTES = 20 * 2**20
MAX_DEPTH = 12  # a trace is 5 deep (top -> rounds -> round -> candidates -> candidate)
MAX_PARSE_DEPTH = 64  # checked on the text before parsing (far below Python's recursion limit); the
                      # field checks then name the field nested deeper than MAX_DEPTH
MAX_ITEMS = 200_000  # tokens, rounds, token ids; candidates per round: MAX_CANDIDATES
MAX_CANDIDATES = 4096
MAX_KEYS = 256  # keys of one object
MAX_TEXT = 2_000_000  # prompt and output text
MAX_TOKEN_TEXT = 1_000  # one token's text
MAX_NAME = 1_000  # method, device, model names, any string the schema does not name
MAX_CONTAINERS = 1_000_000  # lists and objects in one JSON text (a 20 MB trace has about 200,000)
MAX_VALUES = 4_000_000  # values in one JSON text (a 20 MB trace has about 1,500,000)
MAX_INT = 2**53  # JSON numbers beyond this are not exact in JavaScript

# the depth check before parsing runs in C and numpy, linear in the text (one regex for a string with its
# escapes was quadratic on a string that never closes: 92 s for '"' + '\\"' * 80_000)
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_QUOTE, _COMMA = ord('"'), ord(",")
_CHUNK = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


class TraceError(ValueError):
    """A trace refused at the gate; the message names the field."""


class NotJSONError(TraceError):
    """The text is not JSON at all; `detail` says where it breaks."""

    def __init__(self, detail: str):
        super().__init__(f"not a VIA-SD trace: not JSON ({detail})")
        self.detail = detail


def _fail(path: str, what: str, value=None, show: bool = True) -> None:
    got = f", got {_show(value)}" if show else ""
    raise TraceError(f"not a VIA-SD trace: {path} {what}{got}")


def _show(value) -> str:
    if isinstance(value, (dict, list)):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


# ---- before parsing ------------------------------------------------------------------------------

def json_shape(text: str | bytes) -> tuple[int, int, int]:
    """(deepest nesting, lists and objects, commas) of JSON text outside its strings, without parsing it: no
    recursion, time linear in the text. Escaped backslashes, then escaped quotes are dropped (left to right,
    as JSON reads them); a character counts where an even number of quotes precede it."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    deepest = level = quotes = containers = commas = 0
    for start in range(0, len(data), _CHUNK):
        chunk = np.frombuffer(data, np.uint8, min(_CHUNK, len(data) - start), start)
        is_quote = chunk == _QUOTE
        outside = ((np.cumsum(is_quote, dtype=np.int64) + quotes) & 1) == 0
        steps = np.where(outside, _STEP[chunk], 0)
        running = np.cumsum(steps, dtype=np.int64) + level
        quotes, level = quotes + int(np.count_nonzero(is_quote)), int(running[-1])
        deepest = max(deepest, int(running.max()))
        containers += int(np.count_nonzero(steps == 1))
        commas += int(np.count_nonzero(outside & (chunk == _COMMA)))
    return deepest, containers, commas


def json_depth(text: str | bytes) -> int:
    """Deepest nesting of [ and { in JSON text outside its strings (`json_shape`)."""
    return json_shape(text)[0]


def parse_json(text: str | bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_PARSE_DEPTH):
    """JSON text -> Python data, refusing oversized or overly nested text before parsing it."""
    if isinstance(text, str):
        if len(text) > max_bytes:  # a character is at least a byte: refused before it is encoded
            raise TraceError(f"not a VIA-SD trace: {len(text):,} characters, more than the {max_bytes:,} bytes a "
                             "trace may have")
        if (lone := _SURROGATE.search(text)) is not None:
            raise NotJSONError(f"not UTF-8 text: a lone surrogate at character {lone.start():,}")
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > max_bytes:
        raise TraceError(f"not a VIA-SD trace: {size:,} bytes, more than the {max_bytes:,} a trace may have")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise NotJSONError("not UTF-8 text") from None
    depth, containers, commas = json_shape(text)
    if depth > max_depth:
        raise TraceError(f"not a VIA-SD trace: nested {depth} deep, more than the {max_depth} a trace may be")
    # parsing holds the interpreter for its whole length: bound what it builds (20 MB of `[],` took 1.3 s)
    if containers > MAX_CONTAINERS:
        raise TraceError(f"not a VIA-SD trace: {containers:,} lists and objects, more than the {MAX_CONTAINERS:,} "
                         "a trace may have")
    if commas >= MAX_VALUES:
        raise TraceError(f"not a VIA-SD trace: {commas + 1:,} values, more than the {MAX_VALUES:,} a trace may have")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise NotJSONError(f"{err.msg}, line {err.lineno}") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer of more than 4300 digits
        raise NotJSONError(str(err)[:200]) from None


def load_trace_json(text: str | bytes) -> dict:
    """JSON text of one trace -> its checked dict (what `Trace.from_json` builds from)."""
    data = parse_json(text)
    check_trace(data)
    return data


def load_traces_json(text: str | bytes) -> list[dict]:
    """JSON text of one trace or a list of traces -> their checked dicts."""
    data = parse_json(text)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise TraceError("not a VIA-SD trace: the file holds an empty list")
    if len(items) > len(METHODS):
        raise TraceError(f"not a VIA-SD trace: the file holds {len(items)} traces; at most {len(METHODS)} "
                         "(one per method) replay together")
    for n, item in enumerate(items):
        check_trace(item, "" if len(items) == 1 else f"[{n}].")
    return items


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


def _bound(path, v, name, optional=False):
    """A setting `DecodeConfig` takes: the bounds it was made within (`config.BOUNDS`)."""
    bound = BOUNDS[name]
    _number(path, v, bound.lo, bound.hi, integer=bound.whole, optional=optional)


def _count(path, v, hi=MAX_INT, optional=False):
    _number(path, v, 0, hi, integer=True, optional=optional)


def _ms(path, v, optional=False):
    _number(path, v, 0.0, 1e12, optional=optional)


def _prob(path, v, optional=True):
    _number(path, v, 0.0, 1.0, optional=optional)


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
            known[k](sub, v)
        else:
            _generic(sub, v, depth + 1)


def _thresholds(path, v):
    if _object(path, v, optional=True):
        _fields(path, v, {"accept": lambda p, x: _prob(p, x, False), "escalate": lambda p, x: _prob(p, x, False),
                          "signal": lambda p, x: _choice(p, x, SIGNALS)}, 3, required=("accept", "escalate"))
        if v["escalate"] > v["accept"]:
            _fail(f"{path}.escalate", f"must not exceed accept ({v['accept']})", v["escalate"])


def _gamma(path, v):
    if v != "auto":  # drafts per round: chosen each round by the cost model, or fixed
        _count(path, v, 4096)


def _call(path, v):
    _object(path, v)
    _fields(path, v, {"model": lambda p, x: _choice(p, x, ("drafter", "slim", "full")),
                      "rows": lambda p, x: _count(p, x, MAX_ITEMS), "past": lambda p, x: _count(p, x, MAX_ITEMS),
                      "resume": _flag, "prompt": _flag}, 4, required=("model", "rows"))


def _config(path, v):
    _object(path, v)
    _fields(path, v, {"gamma": _gamma, "max_new_tokens": lambda p, x: _count(p, x, MAX_ITEMS),
                      "temperature": lambda p, x: _bound(p, x, "temperature"),
                      "top_p": lambda p, x: _prob(p, x), "seed": lambda p, x: _bound(p, x, "seed", optional=True),
                      "thresholds": _thresholds, "draft_stop": lambda p, x: _prob(p, x),
                      "chat": lambda p, x: _flag(p, x), "progressive": lambda p, x: _flag(p, x),
                      "max_unverified": lambda p, x: _count(p, x, MAX_ITEMS),
                      "slim_cache": lambda p, x: _choice(p, x, ("own", "full")),
                      "reuse_opening": lambda p, x: _flag(p, x),
                      "drafter": lambda p, x: _choice(p, x, DRAFTER_KINDS),
                      "lookup_ngram": lambda p, x: _bound(p, x, "lookup_ngram"),
                      "lookup_tokens": lambda p, x: _bound(p, x, "lookup_tokens"),
                      "exit_layer": lambda p, x: _count(p, x, 4096)}, 1)


def _models(path, v):
    _object(path, v)
    _fields(path, v, {"drafter": lambda p, x: _string(p, x, optional=True),
                      "verifier": lambda p, x: _string(p, x, optional=True),
                      "route": lambda p, x: _string(p, x, optional=True),
                      "drafter_kind": lambda p, x: _choice(p, x, DRAFTER_KINDS),
                      "skipped": lambda p, x: _each(p, x, lambda q, y: _string(q, y), MAX_CANDIDATES),
                      "skip_fraction": lambda p, x: _prob(p, x)}, 1)


def _token(path, v):
    _object(path, v)
    _fields(path, v, {"i": lambda p, x: _count(p, x, MAX_ITEMS), "id": lambda p, x: _count(p, x, optional=True),
                      "text": lambda p, x: _string(p, x, MAX_TOKEN_TEXT),
                      "round": lambda p, x: _count(p, x, MAX_ITEMS),
                      "tier": lambda p, x: _choice(p, x, TIERS), "outcome": lambda p, x: _choice(p, x, OUTCOMES),
                      "p_draft": _prob, "q_slim": _prob, "q_full": _prob, "confidence": _prob}, 2,
            required=("text", "tier", "round"))


def _candidate(path, v):
    _object(path, v)
    _fields(path, v, {"pos": lambda p, x: _count(p, x, MAX_CANDIDATES), "token": lambda p, x: _count(p, x),
                      "text": lambda p, x: _string(p, x, MAX_TOKEN_TEXT),
                      "p_draft": _prob, "q_slim": _prob, "q_full": _prob, "confidence": _prob,
                      "slim_top": lambda p, x: _count(p, x, optional=True),
                      "full_top": lambda p, x: _count(p, x, optional=True),
                      "tier": lambda p, x: _choice(p, x, TIERS, optional=True),
                      "decision": lambda p, x: _choice(p, x, DECISIONS)}, 4, required=("pos", "decision"))


def _round(path, v):
    _object(path, v)
    known = {"round": lambda p, x: _count(p, x, MAX_ITEMS), "full_called": _flag, "slim_called": _flag,
             "gamma": lambda p, x: _count(p, x, 4096), "calls": lambda p, x: _each(p, x, _call, MAX_CANDIDATES),
             "forced_by": lambda p, x: _choice(p, x, ("max_unverified",), optional=True),
             "candidates": lambda p, x: _each(p, x, _candidate, MAX_CANDIDATES)}
    known.update({f"{phase}_ms": _ms for phase in ("start", "draft", "slim", "full", "other")})
    _fields(path, v, known, 2, required=("round", "candidates"))


def _summary(path, v):
    _object(path, v)
    known = {k: lambda p, x: _count(p, x) for k in ("new_tokens", "drafted", "full_calls", "slim_calls",
                                                     "prompt_tokens", "opening_tokens")}
    known.update({k: _ms for k in ("prefill_ms", "wall_ms")})
    known.update({k: lambda p, x: _number(p, x, 0.0) for k in ("tokens_per_s", "mean_accepted_length",
                                                               "full_calls_per_token")})
    known.update({"rejection_rate": lambda p, x: _prob(p, x, False), "stopped": _flag,
                  "tier_counts": _tier_counts})
    _fields(path, v, known, 1)


def _tier_counts(path, v):
    _object(path, v)
    _fields(path, v, {t: lambda p, x: _count(p, x) for t in TIERS}, 2)


def _each(path, v, check, limit=MAX_ITEMS):
    _list(path, v, limit)
    for n, item in enumerate(v):
        check(f"{path}[{n}]", item)


TOP = {
    "schema": lambda p, x: None,  # checked first, below
    "method": lambda p, x: _choice(p, x, METHODS),
    "prompt": lambda p, x: _string(p, x, MAX_TEXT),
    "text": lambda p, x: _string(p, x, MAX_TEXT),
    "token_ids": lambda p, x: _each(p, x, lambda q, y: _count(q, y)),
    "models": _models,
    "device": lambda p, x: _string(p, x),
    "dtype": lambda p, x: _string(p, x),
    "config": _config,
    "tokens": lambda p, x: _each(p, x, _token),
    "rounds": lambda p, x: _each(p, x, _round),
    "summary": _summary,
}


def check_trace(data, prefix: str = "") -> None:
    """Raise TraceError naming the first field of `data` (a parsed trace) that breaks the schema."""
    if not isinstance(data, dict):
        raise TraceError(f"not a VIA-SD trace: {prefix or 'the file'} holds {_show(data)}, not a trace object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise TraceError(f"not a VIA-SD trace: {prefix}schema must be {SCHEMA!r}, got {_show(schema)}")
    try:
        _fields(prefix.rstrip("."), data, TOP, 0, required=("method", "prompt", "tokens", "rounds", "summary"))
    except RecursionError:  # only reachable for a dict built in Python, never from parsed JSON
        raise TraceError(f"not a VIA-SD trace: {prefix or 'the trace'} is nested too deeply") from None
