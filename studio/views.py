"""What follows a run or an upload: the figures, the trace table and its files, the learn view, the race.

Each step after a run checks that its traces are still the session's latest run and is skipped
otherwise: a new Run never waits behind the pictures of the last one.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import gradio as gr

import viz
import viz.page as page
from via_sd import Trace
from via_sd.core.trace_check import NotJSONError, TraceError, load_traces_json
from viz.learn import EMPTY as LEARN_EMPTY
from viz.learn import learn_error_html, learn_html
from viz.race import race_end_ms, race_html

from .downloads import DOWNLOADS, write_atomic
from .inputs import UserError, check_round, refuse
from .runs import METHODS, is_current, panes, runs_of, warn

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
RACE_FPS = 12
RACE_SPEEDS = ("0.25", "0.5", "1", "2", "4")  # the race speed control's values (strings: a client sends them as is)
MIN_RACE_SPEED, MAX_RACE_SPEED = 0.05, 50.0
TABLE_COLUMNS = ["i", "text", "round", "tier", "outcome", "p_draft", "q_slim", "q_full", "confidence", "id"]


def _theme(theme) -> str:
    return theme if theme in viz.THEMES else "light"


def learn_trace(traces: dict):
    """The trace the learn view walks: VIA-SD's, else SD's."""
    for m in ("via", "sd"):
        if (traces or {}).get(m) is not None and traces[m].rounds:
            return traces[m]
    return None


def views(traces: dict, theme: str = "light", request: gr.Request = None):
    """Plots and the learn slider after a run or an upload.

    Returns (confidence, tier mix, latency, speed-up, acceptance by position, learn slider, learn view).
    """
    if not is_current(traces, request):
        return (gr.skip(),) * 7
    theme = _theme(theme)
    runs = [t for t in runs_of(traces).values() if t.tokens]
    main = next((t for t in runs if t.method != "ar"), runs[0] if runs else None)
    if main is None:
        return None, None, None, None, None, gr.Slider(minimum=1, maximum=2, value=1), learn_view(traces, 1)
    rounds = len(learn_trace(traces).rounds) if learn_trace(traces) else 1
    return (viz.confidence_figure(main, theme=theme), viz.tier_mix_figure(runs, theme=theme),
            viz.latency_figure(runs, theme=theme), viz.speedup_figure(runs, theme=theme),
            viz.acceptance_by_position_figure([t for t in runs if t.method != "ar"] or runs, theme=theme),
            gr.Slider(minimum=1, maximum=max(rounds, 2), value=1, step=1), learn_view(traces, 1))


def learn_view(traces: dict, k=1) -> str:
    """Round k (1-based, as on the slider) of the last VIA-SD trace (SD if none)."""
    trace = learn_trace(traces)
    if trace is None:
        return LEARN_EMPTY
    try:
        return learn_html(trace, check_round(k, len(trace.rounds)) - 1)
    except UserError as err:
        return learn_error_html(str(err))


def learn_api(traces: dict, k=1) -> str:
    """/learn: round k (1-based) of the session's last VIA-SD trace (SD if none), for a client. A value that is no
    round of the trace is refused by name (the page's slider gets `learn_view`'s message in the view instead)."""
    trace = learn_trace(traces)
    try:
        k = check_round(k, len(trace.rounds) if trace else None)
    except UserError as err:
        raise refuse(err) from None
    return learn_view(traces, k)


def step_round(k, delta, traces: dict) -> int:
    """The learn slider's next value (1-based), clamped to the recorded rounds."""
    trace = learn_trace(traces)
    last = len(trace.rounds) if trace else 1
    return max(1, min(int(k or 1) + int(delta), last))


def trace_table(traces: dict, method: str = "via", request: gr.Request = None):
    """Trace tab: (table rows, JSON file, CSV file) of the chosen method's trace."""
    import pandas as pd

    trace = (traces or {}).get(method) if method in METHODS else None
    if trace is None:
        return pd.DataFrame(columns=TABLE_COLUMNS), None, None
    rows = [{c: round(t[c], 4) if isinstance(t.get(c), float) else t.get(c) for c in TABLE_COLUMNS}
            for t in trace.tokens]
    folder = DOWNLOADS.folder(request)
    json_path, csv_path = folder / f"via-sd-trace-{method}.json", folder / f"via-sd-trace-{method}.csv"
    write_atomic(json_path, trace.to_json(indent=1))
    write_atomic(csv_path, trace.to_csv())
    return pd.DataFrame(rows, columns=TABLE_COLUMNS), str(json_path), str(csv_path)


def trace_table_after_run(traces: dict, method: str = "via", request: gr.Request = None):
    if not is_current(traces, request):
        return gr.skip(), gr.skip(), gr.skip()
    return trace_table(traces, method, request)


def check_trace(trace: Trace) -> None:
    """Raises ValueError unless every view of the app can draw `trace` (an upload is untrusted; its fields
    passed `via_sd.core.trace_check` already, this catches what only drawing finds)."""
    traces = {trace.method: trace}
    try:
        page.pane_html(trace, trace.method)
        page.metrics_html(traces)
        views(traces)
        learn_view(traces, 1)
        if trace.method == "via" and trace.rounds:
            viz.what_if(trace, (trace.config or {}).get("thresholds"))
    except Exception as err:
        raise ValueError(f"its contents do not fit the trace schema ({type(err).__name__}: {err})") from None


def read_traces(files) -> dict:
    """Uploaded files -> {method: Trace}; a file that is not a VIA-SD trace raises UserError."""
    if not files:
        raise UserError("No file uploaded.")
    files = files if isinstance(files, list) else [files]
    if len(files) > len(METHODS):
        raise UserError(f"{len(files)} files: upload at most {len(METHODS)} traces (one per method) at once.")
    traces = {}
    for f in files:
        path = Path(getattr(f, "name", f))
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            raise UserError(f"{path.name} is larger than {MAX_UPLOAD_BYTES // 2**20} MB: not a trace this app reads.")
        try:
            text = path.read_bytes().decode("utf-8")
            # the gate: size and nesting depth before parsing, then every field (via_sd.core.trace_check)
            for item in load_traces_json(text):
                trace = Trace.from_dict(item)
                check_trace(trace)
                traces[trace.method] = trace
        except UnicodeDecodeError:
            raise UserError(f"{path.name} is not a text file: upload a trace JSON saved by this app.") from None
        except NotJSONError as err:
            raise UserError(f"{path.name} is not JSON ({err.detail}): upload a trace saved by this app.") from None
        except TraceError as err:
            raise UserError(f"{path.name} is {err}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise UserError(f"{path.name} is not a VIA-SD trace: {err}") from None
    return traces


def replay_upload(files):
    """Upload: fill the panes and metrics from trace files, no model needed.

    Returns (via pane, sd pane, ar pane, metrics, status, run record).
    """
    try:
        traces = read_traces(files)
    except UserError as err:
        warn(str(err))
        return (gr.skip(),) * 4 + (page.status_html(str(err), "error"), gr.skip())
    record = {**traces, "fidelity": {"note": "not measured for an uploaded trace"}}
    names = ", ".join(page.METHOD_TITLES[m] for m in traces if m in page.METHOD_TITLES)
    return (*panes(record), page.metrics_html(traces, record["fidelity"]),
            page.status_html(f"Replaying uploaded trace: {names}", "ok"), record)


# ---- race replay ----------------------------------------------------------------------------------

def race_traces(traces: dict) -> dict:
    return {m: t for m, t in runs_of(traces).items() if t.rounds}


def race_ready(traces: dict, race_view: str = "", request: gr.Request = None):
    """The race area after a run or an upload: what can be replayed (a race already playing is left alone)."""
    if 'data-state="playing"' in (race_view or "") or 'data-state="done"' in (race_view or ""):
        return gr.skip()
    if not is_current(traces, request):
        return gr.skip()
    return page.race_ready_html(list(race_traces(traces)))


def race_speed(speed) -> float:
    """The race's speed: one of the control's choices ("0.25" ... "4"), or from Python a number in [0.05, 50];
    anything else is refused, naming the field and what it allows."""
    if isinstance(speed, str) and speed in RACE_SPEEDS:
        return float(speed)
    if (isinstance(speed, (int, float)) and not isinstance(speed, bool) and math.isfinite(speed)
            and MIN_RACE_SPEED <= speed <= MAX_RACE_SPEED):
        return float(speed)
    raise gr.Error(f"race speed must be one of {', '.join(map(repr, RACE_SPEEDS))} (times the recorded time), "
                   f"got {str(speed)[:30]!r}", print_exception=False)


def race_replay(traces: dict, speed="1"):
    """Plays the recorded traces side by side in their recorded time, `speed` × faster (frames of HTML)."""
    speed = race_speed(speed)
    runs = race_traces(traces)
    if not runs:
        yield page.RACE_HINT
        return
    end = race_end_ms(runs)
    start = time.perf_counter()
    while (t := (time.perf_counter() - start) * 1000 * speed) < end:
        yield race_html(runs, t, speed)
        time.sleep(1 / RACE_FPS)
    yield race_html(runs, end, speed)
