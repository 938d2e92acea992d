"""The threshold lab (an instant what-if estimate on the recorded trace, a measured sweep), the
threshold presets, and the search for a better slim route. The sweep and the search are a session's
work like a run: Stop ends them (`studio.sessions`)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import gradio as gr

import via_sd
import viz
import viz.page as page
from viz.lab import EMPTY as WHATIF_EMPTY
from viz.lab import what_if_card_html, what_if_error_html
from viz.presets import preset_points_figure

from .engine import how_made, route_for, run_sweep
from .gpu import gpu
from .inputs import (MAX_GRID, SIGNALS, UserError, check_prompt, choice, grid_size, make_config, make_thresholds,
                     name, number, parse_grid, refuse)
from .inputs import route as check_route
from .models import LOCK_REASON, MODELS, preset_locked
from .runs import is_current
from .sessions import SESSIONS

log = logging.getLogger("via_sd.app")
CUSTOM = "custom"
DEFAULT_THRESHOLD_PRESET = "paper"  # the paper's rule: all three tiers show on the examples


def _theme(theme) -> str:
    return theme if theme in viz.THEMES else "light"


# ---- what-if: re-tier the recorded drafts, no model ----------------------------------------------

def _what_if_input(traces: dict, accept, escalate, signal):
    """(trace, thresholds) to re-tier, or (None, message HTML). A value no control sends (text, out of range) raises
    UserError naming it; thresholds out of order, as the sliders can be while they move, get the card's message."""
    accept, escalate = number("accept", accept), number("escalate", escalate)
    signal = choice("signal", signal, SIGNALS)
    trace = (traces or {}).get("via")
    if trace is None or not trace.rounds:
        return None, WHATIF_EMPTY
    try:
        return trace, make_thresholds(accept, escalate, signal)
    except UserError as err:
        return None, what_if_error_html(str(err))


def what_if_card(traces: dict, accept, escalate, signal) -> str:
    """The estimate card alone (/what_if): under a millisecond, so it follows a slider while it moves."""
    try:
        trace, th = _what_if_input(traces, accept, escalate, signal)
    except UserError as err:
        raise refuse(err) from None
    return th if trace is None else what_if_card_html(viz.what_if(trace, th))


def what_if_figure(traces: dict, accept, escalate, signal, theme: str = "light"):
    """The confidence plot re-tiered under the slider thresholds (None without a VIA-SD trace)."""
    trace, th = _what_if_input(traces, accept, escalate, signal)
    return None if trace is None else viz.confidence_figure(trace, thresholds=th, theme=_theme(theme))


def what_if_view(traces: dict, accept, escalate, signal, theme: str = "light", request: gr.Request = None):
    """Re-tier the last VIA-SD trace under the slider thresholds: an ESTIMATE. Returns (card, figure)."""
    if not is_current(traces, request):
        return gr.skip(), gr.skip()
    return what_if_card(traces, accept, escalate, signal), what_if_figure(traces, accept, escalate, signal, theme)


def what_if_presets(traces: dict, accept, escalate, signal, theme: str = "light", request: gr.Request = None):
    """The named threshold presets (and the sliders) placed on the last VIA-SD trace: an ESTIMATE."""
    if not is_current(traces, request):
        return gr.skip()
    try:
        current = make_thresholds(accept, escalate, signal).to_dict()
    except UserError:
        current = None
    presets = {name: th.to_dict() for name, th in via_sd.THRESHOLD_PRESETS.items()}
    return preset_points_figure((traces or {}).get("via"), presets, current, theme=_theme(theme))


# ---- threshold presets ----------------------------------------------------------------------------

def threshold_preset_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in via_sd.THRESHOLD_PRESETS] + [(CUSTOM, CUSTOM)]


HELD_OUT = Path(__file__).resolve().parent.parent / "assets" / "presets_held_out.json"


def held_out_results() -> dict:
    """Each preset's speed and agreement on the held-out prompts, which no threshold was chosen on
    (benchmarks/cost_targets.py --record); {} when the file is missing or unreadable."""
    try:
        return json.loads(HELD_OUT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def threshold_preset_info() -> str:
    about = {"paper": "the paper's rule", "fastest": "fastest at ≥ 0.96 agreement on the tuning prompts",
             "lossless": "= plain SD"}
    text = " · ".join(f"{name} ({about.get(name, '')}): {th.signal} {th.accept:.2f}/{th.escalate:.2f}"
                      for name, th in via_sd.THRESHOLD_PRESETS.items())
    held = held_out_results()
    measured = [f"{name} {r['speedup_vs_ar']:.2f}× AR at agreement {r['agreement']:.3f}"
                for name, r in held.get("presets", {}).items()]
    if measured:
        text += (f". On the held-out prompts, never tuned on ({held['pairs']} paired runs, {held['date']}): "
                 + "; ".join(measured))
    return text


def apply_threshold_preset(name):
    """A preset chosen: its (accept, escalate, signal) go to the controls; "custom" leaves them."""
    th = via_sd.THRESHOLD_PRESETS.get(name)
    if th is None:
        return gr.skip(), gr.skip(), gr.skip()
    return th.accept, th.escalate, th.signal


# ---- a measured sweep ----------------------------------------------------------------------------

def take_sweep_ticket(theme="light", request: gr.Request = None):
    return SESSIONS.get(request).ticket("sweep"), theme


@gpu(duration=300)
def measure_sweep(prompt, preset, gamma, signal, temperature, max_new_tokens, seed, route, accepts, escalates,
                  accept, escalate, theme="light", ticket=None, request: gr.Request = None, progress=gr.Progress()):
    """Run VIA-SD for real at every (accept, escalate) of the grid and plain SD on the same prompt
    (`via_sd.bench.run_sweep`, interleaved). Returns (frontier figure, status).

    Speed-up is over plain SD, fidelity the full model's top-1 agreement with the output. A sweep its settings
    cannot start (a bad value, a grid too large or with no setting) is refused with a message naming the field.
    """
    job = SESSIONS.get(request).job("sweep", ticket)
    if job.is_set():
        return gr.skip(), page.status_html("Sweep stopped before it started (Stop was pressed while it waited in "
                                           "the queue).", "stop")
    try:
        check_prompt(prompt)
        accept_values, escalate_values = parse_grid(accepts, "accept values"), parse_grid(escalates, "escalate values")
        size = grid_size(accept_values, escalate_values)
        if not size:
            raise UserError("No (accept, escalate) pair in the grid has escalate ≤ accept.")
        if size > MAX_GRID:
            raise UserError(f"The grid has {size:,} settings; keep it to {MAX_GRID} or fewer.")
        config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed)
        preset, route = name("preset", preset), check_route(route)
        pair = MODELS.view(MODELS.wait(preset, progress), preset, route)
        result = _sweep(pair, preset, [{"task": "app", "prompt": prompt}], config, accept=accept_values,
                        escalate=escalate_values, signals=[config.thresholds.signal], repeats=1, warmup=1,
                        progress=lambda message, fraction: progress(fraction, desc=message), stop=job)
        if result["sd"] is None:
            return gr.skip(), page.status_html("Sweep stopped before plain SD was measured: nothing to show.", "stop")
        points = result["points"] + [{**result["sd"], "label": "plain SD"}]
        current = {"accept": float(accept), "escalate": float(escalate), "signal": config.thresholds.signal}
        figure = viz.frontier_figure(points, current=current, theme=_theme(theme), baseline="SD")
        best = result.get("best")
        tip = (f" Fastest with ≥95% agreement: accept {best['accept']:.2f}, escalate {best['escalate']:.2f} "
               f"({best['speedup']:.2f}× SD)." if best else " No setting reached 95% agreement.")
        if result.get("stopped"):
            return figure, page.status_html(f"Sweep stopped: {len(result['points'])} of {size} settings measured "
                                            "(shown) against plain SD on this prompt.", "stop")
        return figure, page.status_html(f"Sweep done: {size} settings measured against plain SD "
                                        f"({result['sd']['tokens_per_s']:.1f} tokens/s) on this prompt.{tip}", "ok")
    except UserError as err:
        raise refuse(err) from None
    except Exception as err:
        log.exception("sweep failed")
        return None, page.status_html(f"Sweep failed: {type(err).__name__}: {err}", "error")


def _sweep(pair, preset: str, prompts, config, **options) -> dict:
    """run_sweep here, or on the Ray cluster VIA_SD_CLUSTER names ("auto" or an address; docs/cluster.md), whose
    workers load the preset with this pair's route."""
    address = os.environ.get("VIA_SD_CLUSTER")
    if not address:
        return run_sweep(pair, prompts, config, **options)
    from via_sd.bench.cluster import Cluster, ray_missing
    from via_sd.bench.spread import run_cluster_sweep

    if ray_missing():
        raise RuntimeError("VIA_SD_CLUSTER is set, but Ray is not installed: pip install -r requirements-cluster.txt")
    with Cluster({"preset": preset, "route": list(pair.route.skip) or "none"}, address) as cluster:
        return run_cluster_sweep(cluster, prompts, config, **options)


# ---- a better route for a pair that runs a provisional one ----------------------------------------

def route_search_row(preset):
    """The "search a better route" buttons show while the loaded pair runs a provisional route (never on a
    shared deployment: a search holds the model for minutes and changes the route of every visitor)."""
    pair, route = MODELS.loaded(preset), MODELS.default_route(preset)
    provisional = route is not None and bool(route.meta.get("provisional"))
    return gr.Row(visible=pair is not None and provisional and not preset_locked())


def take_route_ticket(request: gr.Request = None):
    return SESSIONS.get(request).ticket("route")


@gpu(duration=300)
def search_better_route(preset, ticket=None, request: gr.Request = None, progress=gr.Progress()):
    """Search a measured route for the loaded pair in place of its provisional one (progress shown, Stop
    ends it, cached for next time). Returns (device line, status, route buttons row)."""
    if preset_locked():
        return (MODELS.status(preset), page.status_html(f"Route search is off here: the model is {LOCK_REASON}.",
                                                        "error"), gr.skip())
    shared = MODELS.loaded(preset)
    if shared is None:
        return MODELS.status(preset), page.status_html("The models are not loaded yet.", "error"), gr.skip()
    job = SESSIONS.get(request).job("route", ticket)
    if job.is_set():
        return MODELS.status(preset), page.status_html("Route search stopped before it started.", "stop"), gr.skip()
    try:
        # the search works on a view of its own: runs meanwhile keep the route they asked for
        pair = MODELS.view(shared, preset, "default")
        route = route_for(pair, progress=lambda message, fraction: progress(fraction, desc=message), stop=job)
    except Exception as err:
        log.exception("route search failed")
        return (MODELS.status(preset), page.status_html(f"Route search failed: {type(err).__name__}: {err}", "error"),
                gr.skip())
    if route.meta.get("search", {}).get("stopped"):
        return (MODELS.status(preset), page.status_html("Route search stopped: the provisional route stays.", "stop"),
                gr.skip())
    MODELS.set_default_route(preset, route)
    return (MODELS.status(preset), page.status_html(f"Searched and cached for next time: {how_made(route)}", "ok"),
            route_search_row(preset))
