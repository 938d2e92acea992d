"""Run: VIA-SD, then plain SD, then AR on the same prompt, each pane streamed as its tokens are decided.

The three run one after another, so their timings are comparable on a machine with few cores. A run
works on its own view of the shared pair (the route it asked for) and stops between rounds when its
session's ticket says so (`studio.sessions`). Fidelity is measured after the run says Done, as a
step of its own that a newer run of the session skips, so nothing a finished run still computes
delays the next one.
"""

from __future__ import annotations

import html
import logging
import time

import gradio as gr

import viz.page as page
from .engine import learn, measure_fidelities, stream_events
from .gpu import run_seconds, gpu
from .inputs import check_prompt, flag, make_config, name
from .inputs import route as check_route
from .models import MODELS
from .sessions import SESSIONS

log = logging.getLogger("via_sd.app")
METHODS = ("via", "sd", "ar")
FRAME_S = 1 / 15  # at most ~15 page updates a second: more than a browser shows, fewer than a fast pair makes
# A run narrates itself (its panes stream tokens, the status line says what runs): no Gradio progress overlay, whose
# timer ticking in a browser on the same machine (a classroom laptop) slowed the run's own passes by up to 1.7x
PROGRESS = "hidden"
MAX_PACE_MS = 2000.0
GPU_GROUP = "gpu"  # app.py's concurrency id of model work (ON_MODEL)
NOTHING_TO_STOP = "Nothing to stop"  # what Stop says when the session has no work queued or running
QUEUED = "Queued: this run starts when the model work ahead of it ends …"  # the status until the run speaks


def warn(message: str) -> None:
    """A warning toast: Gradio renders its message as HTML, so the text is escaped first."""
    gr.Warning(html.escape(str(message)))


def runs_of(traces: dict) -> dict:
    """{method: Trace} of the methods in a run's record (which also holds "ticket", "preset", "fidelity")."""
    return {m: traces[m] for m in METHODS if (traces or {}).get(m) is not None}


def panes(traces: dict, running: str | None = None, live: dict | None = None) -> tuple[str, str, str]:
    return tuple(page.pane_html((traces or {}).get(m), m, running == m, (live or {}).get(m)) for m in METHODS)


def take_run_ticket(theme="light", request: gr.Request = None):
    """Run pressed (before the queue): this session's newer run supersedes its older one at once.
    Returns (ticket, theme, race area: the last race is stale now, status: queued until the run's first words)."""
    return SESSIONS.get(request).ticket("run"), theme, page.RACE_HINT, page.status_html(QUEUED, "run")


def request_rerun(rerun, request: gr.Request = None):
    """A slider released with "re-run on release": a ticket, as a Run press takes. Returns (ticket, race area)."""
    if not rerun:
        return gr.skip(), gr.skip()
    return SESSIONS.get(request).ticket("run"), page.RACE_HINT


def stop_work(request: gr.Request = None) -> str:
    """Stop: ends all of this session's work asked for so far (a queued or running run, a sweep, a route
    search) within a round or a step; other sessions' work goes on. With none, it does nothing: the
    session's next run runs."""
    queued = model_work_queued(request)
    SESSIONS.get(request).stop(queued=queued)
    if not queued:
        return page.status_html(f"{NOTHING_TO_STOP}: no run, sweep or search of yours is running or queued.", "stop")
    return page.status_html("stopping after the current round …", "stop")


def model_work_queued(request) -> bool:
    """Has this session model work (the "gpu" group: a run, a comparison, a sweep, a search) waiting in Gradio's
    queue or running? Read from the queue itself (Gradio has no public call for it): an API client's call holds no
    ticket until it starts. No queue (a direct call): nothing waits."""
    try:
        queue = request.request.app.get_blocks()._queue
        events = list(queue.event_ids_to_events.values())
    except AttributeError:
        return False
    return any(e.session_hash == request.session_hash and e.concurrency_id == GPU_GROUP for e in events)


def with_replacements(candidates: list[dict], pair, greedy: bool) -> list[dict]:
    """Under greedy decoding a replaced draft's replacement is the deciding verifier's top choice: name
    its text, so the pane can show it beside the struck draft (sampling resamples: shown at the round's end)."""
    if not greedy:
        return candidates
    for c in candidates:
        top = c.get(f"{c.get('tier')}_top")
        if c.get("decision") == "replaced" and isinstance(top, int):
            c["replacement_text"] = pair.tokenizer.decode([top])
    return candidates


def run_duration(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed=0, route=None,
                 with_ar=True, *rest, **kw) -> int:
    """ZeroGPU's `duration` for a run: called with the run's own arguments (see `studio.gpu`)."""
    return run_seconds(max_new_tokens, methods_of(with_ar))


def methods_of(with_ar) -> tuple[str, ...]:
    """The methods a comparison runs, in the order it runs them."""
    return ("via", "sd", "ar") if with_ar else ("via", "sd")


def decode_comparison(job, traces: dict, prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens,
                      seed, route, with_ar=True, progress=None, live: dict | None = None, drafter="model", **knobs):
    """The one decoding path of a comparison, shared by the page's Run (`run_compare`) and the API's JSON
    endpoint (`studio.api.compare`): check the settings, wait for the pair, then VIA-SD, plain SD (and AR)
    one after another on the run's own view of the pair, each stopped between rounds by `job`.

    Fills `traces` ({method: Trace}) as rounds finish and, when given, `live` (method -> the round being
    verified); `knobs`: the rest of `via_sd generate`'s settings by name (`inputs.KNOBS`). Yields (None, False)
    once the settings are checked (the models may still be loading then),
    then (method, False) after every engine event and (method, True) when a method ends. A bad setting raises
    UserError; the engine refusing an input raises ValueError.
    """
    check_prompt(prompt)
    config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter, **knobs)
    preset, route, with_ar = name("preset", preset), check_route(route), flag("with_ar", with_ar)
    yield None, False
    with MODELS.waiting_for(preset):  # the load skips its warm-up for a run that waits: the run's passes are it
        while MODELS.loading(preset) and MODELS.loaded(preset) is None and not job.is_set():
            time.sleep(0.5)
            yield None, False  # queued behind the load: the page says which step it waits for
    if job.is_set():
        return
    shared = MODELS.wait(preset, progress)
    MODELS.ensure_warm(shared)  # a no-op once warm; on ZeroGPU the first run warms up inside its GPU call
    pair = MODELS.view(shared, preset, route)
    for method in methods_of(with_ar):
        for event in stream_events(pair, prompt, method, config, stop=job):
            if event.kind == "round":
                traces[method] = event.trace
                if live is not None:
                    live.pop(method, None)
            elif live is not None:  # drafts proposed, or a tier decided some: shown pending / in tier colors
                live[method] = (event.round, with_replacements(event.candidates, pair, config.greedy))
            yield method, False
        if live is not None:
            live.pop(method, None)
        yield method, True
        if job.is_set():
            break
    else:  # a whole comparison: its timed passes keep the cost profile honest for the next one
        learn(pair, [traces[m] for m in methods_of(with_ar) if m in traces])


def ending(job, traces: dict) -> tuple[str, str]:
    """(message, kind) of a comparison that ended without an error: superseded, stopped, or done."""
    if job.superseded:
        return ("Stopped: a newer run of this session replaces this one (Run pressed again, or a slider "
                "released).", "stop")
    if job.stopped:
        return "Stopped. Partial traces are kept; plots and downloads show what ran.", "stop"
    return page.done_message(runs_of(traces)), "ok"


def waiting_message(preset) -> str:
    """What a run that cannot start yet waits for: the load's step and how far it is."""
    if MODELS.loaded(preset) is not None:
        return "starting …"
    load = MODELS.load_progress(preset)
    if load is None:
        return f"loading {preset} … (the run starts when the models are in)"
    fraction, step = load
    return f"Queued: this run starts when the models are ready ({preset} {fraction:.0%} · {step})."


@gpu(duration=run_duration)
def run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route,
                with_ar=True, pace=0, ticket=None, drafter="model", request: gr.Request = None,
                progress=gr.Progress()):
    """Run VIA-SD, then plain SD (then AR), streaming each pane as its tokens are decided.

    Yields (via pane, sd pane, ar pane, metrics, status, run record: {method: Trace, "ticket", "preset"}).
    """
    job = SESSIONS.get(request).job("run", ticket)
    traces: dict = {"ticket": job.ticket, "preset": preset}
    live: dict = {}  # method -> (round, candidates) of the round being verified

    def out(message, kind="run", running=None):
        note = {"note": "measuring … (after the run)"} if kind == "ok" else None
        return (*panes(traces, running, live), page.metrics_html(runs_of(traces), note), page.status_html(message, kind),
                traces)

    if job.is_set():  # asked for, then stopped or replaced while it waited in the queue: it never starts
        if job.superseded:
            yield (gr.skip(),) * 6
            return
        yield (gr.skip(),) * 4 + (page.status_html("Stopped before it started (Stop was pressed while the run "
                                                   "waited in the queue).", "stop"), gr.skip())
        return
    try:
        pace = max(0.0, min(float(pace or 0), MAX_PACE_MS)) / 1000  # slow motion: each step stays this long
        shown, showing = 0.0, None
        for method, done in decode_comparison(job, traces, prompt, preset, gamma, accept, escalate, signal,
                                              temperature, max_new_tokens, seed, route, with_ar, progress, live,
                                              drafter):
            if method is None:
                yield out(waiting_message(preset))
            elif done:
                yield out(f"{page.METHOD_TITLES[method]} done", running=None)
            elif method != showing or pace or time.perf_counter() - shown >= FRAME_S:
                n = len(traces[method].tokens) if method in traces else 0
                yield out(f"{page.METHOD_TITLES[method]}: {n} tokens …", running=method)
                shown, showing = time.perf_counter(), method
                if pace:
                    time.sleep(pace)
        yield out(*ending(job, traces))
    except ValueError as err:  # UserError, or the engine refusing an input (e.g. a prompt beyond the context)
        warn(str(err))
        yield out(str(err), "error")
    except Exception as err:  # never a stack trace in the page; the log keeps it
        log.exception("run failed")
        yield out(f"Something went wrong: {type(err).__name__}: {err}", "error")


def rerun_on_release(rerun, prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed,
                     route, with_ar=True, pace=0, ticket=None, drafter="model", request: gr.Request = None,
                     progress=gr.Progress()):
    """Slider released: run for real when "re-run on release" is ticked, else change nothing. A release that
    a newer one (or a Run press) of this session superseded while it waited in the queue does not run."""
    if not rerun:
        yield (gr.skip(),) * 6
        return
    yield from run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route,
                           with_ar, pace, ticket, drafter, request=request, progress=progress)


def is_current(traces: dict, request=None) -> bool:
    """Is `traces` this session's latest run (no newer run asked for since)? A direct call (no request: a
    script, a test) always draws what it is given."""
    return request is None or SESSIONS.get(request).is_latest("run", (traces or {}).get("ticket"))


SETTLE_S = 2.0  # what follows a run waits this long after Done: a Run pressed meanwhile goes first, the rest is skipped


def settle(traces: dict, request: gr.Request = None) -> dict:
    """A pause after Done before the figures (seconds of CPU on 2 cores) and fidelity (a model pass or two):
    a Run pressed right after Done never shares the machine with them (its first pending draft comes sooner:
    BENCHMARKS.md). An upload or the recorded run the page opens on (no ticket) waits not.

    Returns the run record the follow-up steps draw (they read it, not the session's `traces`, which a newer
    run overwrites while they are queued). Once a newer run was asked for, it ends the chain instead: a
    silent error, and the steps follow with `.success`, so none of them is even sent (each skipped step was a
    round trip and a re-render while the new run read its prompt)."""
    waited = 0.0
    ours = (traces or {}).get("ticket") is not None  # a run of this session, not an upload or the recorded run
    while request is not None and ours and waited < SETTLE_S and is_current(traces, request):
        time.sleep(0.1)
        waited += 0.1
    if not is_current(traces, request):
        raise gr.Error("superseded by a newer run", visible=False, print_exception=False)
    return traces


@gpu(duration=60)
def fidelity_after_run(traces: dict, request: gr.Request = None):
    """After Done: fidelity of VIA-SD and SD against the full model (AR's output as the reference when it
    ran). Skipped once a newer run of this session was asked for. Returns (metrics, run record)."""
    runs = runs_of(traces)
    if not runs or "fidelity" in traces or not is_current(traces, request):
        return gr.skip(), gr.skip()
    # a newer run of this session ends it between passes
    fidelity = fidelity_of(traces, stop=lambda: not is_current(traces, request))
    if not fidelity or not is_current(traces, request):
        return gr.skip(), gr.skip()
    record = {**traces, "fidelity": fidelity}
    return page.metrics_html(runs, fidelity), record


def fidelity_of(traces: dict, stop=None) -> dict | None:
    """The full model's agreement with VIA-SD's and SD's finished outputs (AR's output as the reference when it
    ran), for the page's metric cards and the API's JSON alike. None when nothing can be scored (no loaded pair,
    no finished VIA-SD or SD output) or `stop()` turned true between passes."""
    runs = runs_of(traces)
    pair = MODELS.loaded((traces or {}).get("preset"))
    scored = {m: runs[m] for m in ("via", "sd")
              if runs.get(m) is not None and runs[m].tokens and not (runs[m].summary or {}).get("stopped")}
    if pair is None or not scored:
        return None
    # the prompt read once, the reference scored once
    return measure_fidelities(pair, scored, reference=runs.get("ar"), stop=stop)
