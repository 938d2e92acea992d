"""The one gate for traces from outside (an upload, a file, JSON text): size and nesting depth are
checked before parsing, then every field of schema `via-sd-trace/1` for type and range (`trace_fields`).

A trace that fails raises `TraceError` (a ValueError) with one message naming the field:

    not a VIA-SD trace: summary.tokens_per_s must be a finite number >= 0, got nan

Nothing here imports torch: the app and `viz` use it on traces no model made.
"""

from __future__ import annotations

import json
import re

import numpy as np

# the fields' checks, and the names the gate has always been imported by
from .trace_fields import (MAX_DEPTH, MAX_KEYS, MAX_NAME, METHODS, SCHEMA, SIGNALS, TRACE,  # noqa: F401
                           TraceError, check_trace)

MAX_JSON_BYTES = 20 * 2**20
MAX_PARSE_DEPTH = 64  # checked on the text before parsing (far below Python's recursion limit); the
                      # field checks then name the field nested deeper than MAX_DEPTH
MAX_CONTAINERS = 1_000_000  # lists and objects in one JSON text (a 20 MB trace has about 200,000)
MAX_VALUES = 4_000_000  # values in one JSON text (a 20 MB trace has about 1,500,000)

# the depth check before parsing runs in C and numpy, linear in the text (one regex for a string with its
# escapes was quadratic on a string that never closes: 92 s for '"' + '\\"' * 80_000)
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_QUOTE, _COMMA = ord('"'), ord(",")
_CHUNK = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


class NotJSONError(TraceError):
    """The text is not JSON at all; `detail` says where it breaks."""

    def __init__(self, detail: str):
        super().__init__(f"not a VIA-SD trace: not JSON ({detail})")
        self.detail = detail


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


def json_schema() -> dict:
    """The trace schema as JSON Schema (2020-12), from the specs the gate checks with: docs/api.md publishes it."""
    defs: dict = {}
    body = TRACE.schema(defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": SCHEMA,
            "description": f"Checked by via_sd.core.trace_check. Keys not named here are accepted as plain JSON: "
                           f"finite numbers within +-2**53 (a key ending in _rate, _share, ... in [0, 1], in _ms, "
                           f"_calls, _tokens, ... >= 0), strings of at most {MAX_NAME:,} characters, objects of at "
                           f"most {MAX_KEYS} keys, nested at most {MAX_DEPTH} deep; the text at most "
                           f"{MAX_JSON_BYTES:,} bytes. A file may hold a list of up to {len(METHODS)} traces, one per "
                           "method.",
            **body, "$defs": defs}
