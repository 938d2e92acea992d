"""Writes docs/api.md's JSON Schemas (between its `schema` markers) from the code: /compare's, /bench's and /sweep's
inputs (`studio.api.compare_schema`, `studio.batch.endpoint_schema`, from the app's checks) and a trace (`via_sd.core.trace_check.json_schema`, from the
gate's own specs), both bounded by the one table `via_sd.core.bounds.BOUNDS`. tests/test_api_schema.py fails when
the doc and the code differ.

    .venv/bin/python scripts/api_schema.py    # refresh docs/api.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "api.md"
BEGIN = "<!-- schema: begin (written by scripts/api_schema.py; edit the code, then run it) -->"
END = "<!-- schema: end -->"
WIDTH = 110


def compact(value, indent: int = 0, used: int = 0) -> str:
    """JSON with a value on one line where it fits in WIDTH columns, else its items one per line."""
    flat = json.dumps(value, ensure_ascii=False)
    if used + len(flat) <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        heads = [f"{pad}{json.dumps(k, ensure_ascii=False)}: " for k in value]
        items = [head + compact(v, indent + 2, len(head) + 1) for head, v in zip(heads, value.values())]
    else:
        items = [pad + compact(v, indent + 2, len(pad) + 1) for v in value]
    ends = "{}" if isinstance(value, dict) else "[]"
    return ends[0] + "\n" + ",\n".join(items) + "\n" + " " * indent + ends[1]


def section() -> str:
    """The doc's section between the markers, as the code makes it now."""
    from studio.api import compare_schema
    from studio.batch import bench, endpoint_schema, sweep
    from via_sd.core.trace_check import SCHEMA, json_schema

    return "\n".join([
        BEGIN,
        "`/compare`'s inputs (a bad one is refused with a message that names it and says what it allows):",
        "", "```json", compact(compare_schema()), "```", "",
        "`/bench`'s inputs (and the `bench` tool's; its decoding settings are /compare's):",
        "", "```json", compact(endpoint_schema(bench, "/bench inputs")), "```", "",
        "`/sweep`'s inputs (and the `sweep` tool's):",
        "", "```json", compact(endpoint_schema(sweep, "/sweep inputs")), "```", "",
        f"A trace, `{SCHEMA}` (what the gate checks before an upload, `/what_if_estimate` or "
        "`Trace.from_json` reads one):",
        "", "```json", compact(json_schema()), "```",
        END])


def refreshed(text: str) -> str:
    """`text` (docs/api.md) with its section rewritten."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + section() + text[end:]


if __name__ == "__main__":
    text = DOC.read_text(encoding="utf-8")
    new = refreshed(text)
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    print(f"{DOC.relative_to(ROOT)}: {'rewritten' if new != text else 'up to date'}")
