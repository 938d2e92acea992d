"""The run the page opens on: a real run of the embedded pair, recorded once (scripts/record_runs.py) and shipped
in assets/recorded/, so the three lanes, the race replay, the step-through view and the what-if work in the
first second, long before a model has loaded.

`opening()` is that run as a run record (the shape `runs.run_compare` leaves in the session's state: {method:
Trace, "fidelity": ...}, plus "recorded": where and when), read and checked once per process; None when no
recording is shipped. `label(record)` says what it is, so nobody takes it for a run on this machine.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
from pathlib import Path

from via_sd import Trace
from via_sd.core.trace_check import load_traces_json

log = logging.getLogger("via_sd.app")
FOLDER = Path(__file__).resolve().parent.parent / "assets" / "recorded"
OPENING = "palindrome"  # the recording the page opens on (assets/recorded/NAME.json.gz + NAME.about.json)


def read(name: str, folder: Path = FOLDER) -> dict | None:
    """The recording `name` as a run record, through the same trace gate as an upload; None if absent or broken."""
    try:
        text = gzip.decompress((folder / f"{name}.json.gz").read_bytes()).decode("utf-8")
        about = json.loads((folder / f"{name}.about.json").read_text(encoding="utf-8"))
        traces = {t.method: t for t in map(Trace.from_dict, load_traces_json(text))}
    except (OSError, ValueError) as err:  # a missing or damaged file: the page opens empty, as before
        log.warning("no recorded run to open on (%s): %s", name, err)
        return None
    return {**traces, "fidelity": about.get("fidelity") or {"note": "not measured"}, "recorded": about}


@functools.cache
def opening() -> dict | None:
    return read(OPENING)


def label(record: dict | None) -> str:
    """"Recorded run (not this machine): the embedded pair, 48 tokens, on AMD EPYC (2 cores), 2026-12-03. ..."."""
    about = (record or {}).get("recorded") or {}
    if not about:
        return ""
    machine = f"{about.get('cpu', 'a CPU')} ({about.get('cores', '?')} cores"
    busy = about.get("load_average")
    machine += f", busy: load {busy:g}" if isinstance(busy, (int, float)) and busy >= 1 else ""
    return (f"Recorded run, not this machine: the {about.get('preset', 'embedded')} pair, "
            f"{about.get('max_new_tokens', '?')} tokens, on {machine}), {about.get('date', '?')}. Replay it as a race, "
            "step through it in Learn or move the thresholds; Run decodes live here.")
