"""VIA-SD Studio: watch, compare and tune three-tier speculative decoding in the browser.

    python app.py                      # http://127.0.0.1:7860, embedded Qwen2.5-Coder 0.5B -> 1.5B pair
    VIA_SD_PRESET=random python app.py # tiny random pair: instant, gibberish text (mechanics only)

Layout first (in reading order), then event wiring. Every handler is a plain module-level
function that tests call directly; the app composes `via_sd` (decoding) and `viz` (pictures)
and re-implements neither. VIA-SD, plain SD and (optionally) AR run one after another on the
same prompt, so their timings are comparable on a machine with few cores.
"""

from __future__ import annotations

try:  # ZeroGPU on Hugging Face Spaces; `spaces` must be imported before torch touches CUDA
    import spaces

    gpu = spaces.GPU(duration=120)
except ImportError:
    def gpu(fn):
        return fn

import atexit
import bisect
import gc
import hashlib
import html
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
import torch

import via_sd
import viz
from via_sd import PRESETS, DecodeConfig, ModelLoadError, Thresholds, Trace, generate, load_pair, stream
from viz.live import live_tokens_html
from viz.presets import preset_points_figure
from viz.race import race_end_ms, race_html
from via_sd.bench import run_sweep
from via_sd.fidelity import measure_fidelity
from via_sd.route_search import how_made, pick_route, route_for
from via_sd.routing import shipped_routes
from via_sd.trace_check import NotJSONError, TraceError, load_traces_json

log = logging.getLogger("via_sd.app")
ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
DEFAULT_PRESET = os.environ.get("VIA_SD_PRESET", "embedded")
MAX_PROMPT_CHARS = 6000
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
METHOD_TITLES = {"via": "VIA-SD", "sd": "Plain SD", "ar": "Autoregressive (AR)"}
SHORT = {"via": "VIA-SD", "sd": "SD", "ar": "AR"}
METHOD_ABOUT = {"via": "drafter → slim verifier → full model (three tiers, lossy)",
                "sd": "drafter → full model (two tiers, lossless)",
                "ar": "full model alone, one token per step"}
DEFAULT_THRESHOLD_PRESET = "paper"  # the paper's rule: all three tiers show on the examples
_PAPER = via_sd.THRESHOLD_PRESETS[DEFAULT_THRESHOLD_PRESET]
DEFAULTS = {"gamma": 5, "accept": _PAPER.accept, "escalate": _PAPER.escalate,
            "signal": _PAPER.signal, "temperature": 0.0, "max_new_tokens": 64, "seed": 0}
# One theme check for every event that draws figures: Gradio marks dark mode with body.dark.
THEME_JS = "() => document.body.classList.contains('dark') ? 'dark' : 'light'"
PRESENTATION_JS = "(on) => { document.body.classList.toggle('presentation', !!on); return []; }"


class UserError(ValueError):
    """Bad input: shown in the page as a plain message, never as a stack trace."""


# ---- models: one loaded pair, shared by every session -------------------------------------------

_pairs: dict = {}  # preset -> ModelPair; at most one entry, so switching frees the old pair
_default_routes: dict = {}  # preset -> the Route picked at load (or searched later) for a preset without one
_pairs_lock = threading.Lock()
_load_state = {"preset": None, "error": None,  # what is loading now / why the last load failed
               "message": "", "fraction": 0.0}  # the load's latest progress, shown on the page


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _is_hub_id(source: str) -> bool:
    """"org/name" is a hub id; embedded:/random: sources, .gguf files and local folders are not."""
    return (not source.startswith(("embedded:", "random:", "/", ".", "~")) and not source.endswith(".gguf")
            and source.count("/") == 1 and not Path(source).exists())


def _needs_hub(preset: str) -> bool:
    spec = PRESETS.get(preset, {})
    return any(_is_hub_id(str(spec.get(k, ""))) for k in ("drafter", "verifier"))


def _hub_cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # an old huggingface_hub or a broken cache: treat as not cached
        return False


def preset_available(preset: str) -> tuple[bool, str]:
    """(can it load here?, why not). Hub presets need the hub or a local copy of both models."""
    if preset not in PRESETS:
        return False, f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}"
    if _needs_hub(preset) and _hub_offline():
        spec = PRESETS[preset]
        missing = [r for r in (spec["drafter"], spec["verifier"]) if _is_hub_id(r) and not _hub_cached(r)]
        if missing:
            return False, (f"preset {preset!r} downloads {', '.join(missing)} from the Hugging Face hub, "
                           "which is switched off here (HF_HUB_OFFLINE=1). Pick 'embedded' (offline, real "
                           "weights) or 'random' (instant, gibberish), or run where the hub is reachable.")
    return True, ""


def free_pairs() -> None:
    """Drop every loaded pair and give its memory back (GPU memory too)."""
    _pairs.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


_served = {"preset": DEFAULT_PRESET}  # the preset the page was built for (`build_demo`)
LOCK_REASON = ("fixed on this shared deployment: every visitor uses the one loaded model, so switching would "
               "unload it for all of them (run the app on your own machine to switch)")


def preset_locked() -> bool:
    """On a Hugging Face Space (SPACE_ID set) or with VIA_SD_LOCK_PRESET=1, nobody may switch the preset."""
    return bool(os.environ.get("SPACE_ID")) or os.environ.get("VIA_SD_LOCK_PRESET", "").lower() in ("1", "true",
                                                                                                   "yes", "on")


def check_preset(preset) -> None:
    if preset_locked() and preset != _served["preset"]:
        raise UserError(f"The model preset is {LOCK_REASON}. This page serves {_served['preset']!r}.")


def get_pair(preset: str, progress=None):
    """The loaded pair of `preset`, loading it (and freeing any other) on first use."""
    check_preset(preset)
    ok, why = preset_available(preset)
    if not ok:
        raise UserError(why)
    with _pairs_lock:
        if preset in _pairs:
            return _pairs[preset]
        free_pairs()
        _load_state.update(preset=preset, error=None)

        def report(message: str, fraction: float) -> None:
            _load_state.update(message=message, fraction=max(0.0, min(float(fraction), 1.0)))
            if progress is not None:
                progress(fraction, desc=f"{preset}: {message}")

        try:
            pair = load_pair(preset, progress=report)
            pick_route(pair, progress=report)  # a shipped or cached route, else the provisional rule: never a search
            _default_routes[preset] = pair.route
            report("warming up", 1.0)
            warm_up(pair)
            _pairs[preset] = pair
        except (ModelLoadError, ValueError, OSError) as err:
            _load_state["error"] = f"could not load preset {preset!r}: {err}"
            raise UserError(_load_state["error"]) from err
        finally:
            _load_state["preset"] = None
        return _pairs[preset]


def warm_up(pair) -> None:
    """Two tokens of SD and VIA-SD, so the first real Run does not pay the one-time costs of a
    model's first forward passes (measured on the embedded pair on CPU: first round 9.2 s cold, 5.5 s warm)."""
    config = DecodeConfig(gamma=2, max_new_tokens=2, thresholds=Thresholds(accept=0.5, escalate=0.1, signal="slim"))
    for method in ("sd", "via"):
        generate(pair, "Hello", method, config)


def preload(preset: str) -> None:
    """Load the startup preset in the background so the page is usable at once."""
    def work():
        try:
            get_pair(preset)
        except Exception as err:  # shown by pair_status; the first Run tries again
            log.warning("background load of %s failed: %s", preset, err)
            if _load_state["preset"] == preset:  # refused before loading began: nothing is loading now
                _load_state["preset"] = None

    _load_state.update(preset=preset, message="starting", fraction=0.0)  # the page shows "loading" at once
    threading.Thread(target=work, name=f"preload-{preset}", daemon=True).start()


def wait_for_pair(preset: str, progress=None):
    """The pair of `preset`; while a background load of it runs, its progress shows in this run's bar."""
    while _load_state["preset"] == preset and preset not in _pairs:
        if progress is not None:
            progress(_load_state["fraction"], desc=f"waiting for {preset}: {_load_state['message'] or 'loading'}")
        time.sleep(0.25)
    return get_pair(preset, progress)


def pair_status(preset: str) -> str:
    """One line next to the preset: device, dtype, models and route, or what is happening."""
    pair = _pairs.get(preset)
    if pair is not None:
        route = pair.route
        skipped = f"skips {len(route.skip)} sub-layers ({route.skip_fraction:.0%})" if route.skip else "skips nothing"
        made = (" — **provisional** (a rule, not searched): *search a better route* below"
                if route.meta.get("provisional") else "")
        return (f"**{pair.device.type}** · {str(pair.dtype).replace('torch.', '')} · {pair.weights} weights · "
                f"{pair.drafter_name} → "
                f"{pair.verifier_name} · slim route `{route.name}` {skipped}{made}")
    if _load_state["preset"] == preset:
        f = _load_state["fraction"]
        return (f'<div class="via-load" data-state="loading"><progress value="{f:.3f}" max="1"></progress> '
                f'loading <b>{preset}</b> {f:.0%} · {html.escape(_load_state["message"] or "starting")}'
                f'<br><small>the page works meanwhile; a Run waits for the models</small></div>')
    ok, why = preset_available(preset)
    if not ok:
        return f"⚠ {why}"
    if _load_state["error"] and preset in _load_state["error"]:
        return f"⚠ {_load_state['error']}"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return f"**{device}** · {PRESETS[preset]['about']} · loads on first Run"


PRESET_SHORT = {"embedded": "Qwen2.5-Coder 0.5B → 1.5B, offline", "gpu": "Qwen2.5 0.5B → 7B, GPU",
                "cpu": "Qwen2.5-Coder 0.5B → 1.5B, hub", "tiny": "SmolLM2 135M → 360M, hub",
                "random": "tiny random pair, instant, gibberish"}


def preset_choices() -> list[tuple[str, str]]:
    choices = []
    for name, spec in PRESETS.items():
        label = f"{name} — {PRESET_SHORT.get(name, spec['about'])}"
        if _needs_hub(name) and not preset_available(name)[0]:
            label += " [needs the hub]"
        choices.append((label, name))
    return choices


def route_choices() -> list[tuple[str, str]]:
    return [("preset default", "default"), ("none (slim = full)", "none")] + [(n, n) for n in shipped_routes()]


def apply_route(pair, preset: str, route: str) -> None:
    """Point the shared pair's slim verifier at `route` (each run sets its own, so sessions never mix)."""
    if route in (None, "", "default") and not PRESETS[preset]["route"] and preset in _default_routes:
        if pair.route.name != _default_routes[preset].name:  # the route picked (or searched) for this pair
            pair.set_route(_default_routes[preset])
        return
    wanted = PRESETS[preset]["route"] if route in (None, "", "default") else route
    wanted = wanted or "none"
    if pair.route.name == wanted:
        return
    try:
        pair.set_route(wanted)
    except (ValueError, OSError) as err:
        raise UserError(f"route {wanted!r} does not fit this verifier: {err}") from err


# ---- per-session stop switches -------------------------------------------------------------------

class SessionStop:
    """A session's Stop button. It counts presses instead of holding a flag that a run clears, so a
    Stop pressed while a run still waits in the queue is not lost: each run compares the count with
    the one at the moment it was queued (`mark_queued`) and stops once a later press comes."""

    def __init__(self):
        self.presses = 0
        self.cleared = 0
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            self.presses += 1

    def is_set(self) -> bool:
        return self.presses > self.cleared

    def clear(self) -> None:
        self.cleared = self.presses


class RunStop:
    """One run's stop switch (what the engine polls between rounds): set by any Stop after `since`."""

    def __init__(self, session: SessionStop, since: int):
        self.session, self.since = session, since

    def is_set(self) -> bool:
        return self.session.presses > self.since


_stops: dict[str, SessionStop] = {}
_QUEUED = "via_sd_stop_mark"  # set on the queued request by `mark_queued`


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "local"


def stop_event(request=None) -> SessionStop:
    return _stops.setdefault(_session(request), SessionStop())


def stop_run(request: gr.Request = None) -> str:
    """Stop: the engine checks the switch between rounds, so this session's run ends within a round;
    a run of this session still waiting in the queue ends before it starts."""
    stop_event(request).set()
    return "⏹ stopping after the current round …"


def mark_queued(request) -> None:
    """Remember on the queued request how many Stops its session had pressed when it was queued."""
    state = getattr(getattr(request, "request", None), "state", None)
    if state is not None:
        setattr(state, _QUEUED, stop_event(request).presses)


def run_stop(request=None) -> RunStop:
    """This run's switch: set by a Stop pressed after the run was queued (after it started when it was
    not queued through the page or the API, e.g. a direct call)."""
    session = stop_event(request)
    since = getattr(getattr(getattr(request, "request", None), "state", None), _QUEUED, None)
    return RunStop(session, session.presses if since is None else since)


def on_enqueue(handler):
    """A Gradio `validator=` for `handler`'s event. Gradio runs it when the event enters the queue (for
    the page and for API clients alike); it validates nothing, it only calls `mark_queued`."""
    sig = inspect.signature(handler)
    params = [p for p in sig.parameters.values() if not isinstance(p.default, gr.Progress)]

    def queued(*args):
        # Gradio passes the event's inputs, then the request (each handler takes it after its inputs)
        at = next((i for i, a in enumerate(args) if isinstance(a, gr.Request)), None)
        mark_queued(args[at] if at is not None else None)
        return (None,) * (len(args) if at is None else at)  # one "valid" per input

    queued.__signature__ = sig.replace(parameters=params)
    queued.__annotations__ = {"request": gr.Request}
    return queued


# ---- input checking ------------------------------------------------------------------------------

def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("The prompt is empty: type a prompt or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}. "
                        "Shorten it.")
    return prompt


def make_thresholds(accept, escalate, signal="slim") -> Thresholds:
    accept, escalate = _number("accept", accept, lo=0, hi=1), _number("escalate", escalate, lo=0, hi=1)
    try:
        return Thresholds(accept=accept, escalate=escalate, signal=signal or "slim")
    except (TypeError, ValueError) as err:
        raise UserError(f"Thresholds: {err}") from err


SEED_MAX = 2**32 - 1


def _number(name: str, value, whole: bool = False, lo=None, hi=None):
    """A setting as a number (an int when `whole`), or UserError naming it: the page's message for the API too."""
    kind = "a whole number" if whole else "a number"
    span = f" from {lo:,} to {hi:,}" if lo is not None else ""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
    if not ok or (whole and not float(value).is_integer()) or (lo is not None and not lo <= value <= hi):
        raise UserError(f"Settings: {name} must be {kind}{span}, got {str(value)[:30]}.")
    return int(value) if whole else float(value)


def make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed) -> DecodeConfig:
    thresholds = make_thresholds(accept, escalate, signal)
    gamma, max_new_tokens = _number("gamma", gamma, whole=True), _number("max_new_tokens", max_new_tokens, whole=True)
    temperature, seed = _number("temperature", temperature), _number("seed", seed, whole=True, lo=0, hi=SEED_MAX)
    try:
        return DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            thresholds=thresholds)
    except (TypeError, ValueError) as err:
        raise UserError(f"Settings: {err}") from err


def status_html(message: str, kind: str = "info") -> str:
    # plain symbols, not emoji: they render with any font (a projector PC may have no emoji font)
    icon = {"info": "ⓘ", "ok": "✓", "error": "⚠", "run": "…", "stop": "■"}.get(kind, "")
    return (f'<div class="via-status via-status-{kind}" role="status" data-kind="{kind}">'
            f'<span class="via-status-icon">{icon}</span> {html.escape(message)}</div>')


# ---- rendering (all drawing is viz's; this only frames it) ----------------------------------------

def pane_html(traces: dict, method: str, running: bool = False, live: tuple | None = None) -> str:
    """One output pane: a header with live counts and the tier-colored tokens (hover for details).

    `live`: (round, candidates) of the round being verified now: its drafts follow the tokens, pending
    until a tier decides them."""
    trace = traces.get(method)
    title = f'<div class="via-pane-title"><b>{METHOD_TITLES[method]}</b> <span>{METHOD_ABOUT[method]}</span></div>'
    if live is not None and running:
        s = (trace.summary or {}) if trace is not None else {}
        counts = (f'<div class="via-pane-counts" data-state="running …">{_esc(s.get("new_tokens", 0))} tokens · '
                  f'{_fmt(s.get("tokens_per_s", 0.0), ".1f")} tokens/s · round {int(live[0]) + 1} being verified …'
                  '</div>')
        return title + counts + live_tokens_html(trace, live[1], live[0])
    if trace is None:
        hint = ("Press Run: VIA-SD runs first, then plain SD (then AR if ticked), one after another so "
                "their timings are comparable." if method == "via" else "Waits for the run before it.")
        return f'{title}<div class="via-pane-empty">{hint}</div>'
    s = trace.summary or {}
    state = "running …" if running else ("stopped" if s.get("stopped") else "done")
    counts = (f'<div class="via-pane-counts" data-state="{state}">{_esc(s.get("new_tokens", 0))} tokens · '
              f'{_fmt(s.get("tokens_per_s", 0.0), ".1f")} tokens/s · {len(trace.rounds)} rounds · {state}</div>')
    return title + counts + viz.token_html(trace, legend=False)


def legend_html() -> str:
    """One legend for every pane: what each token color means."""
    return ('<div class="via-legend-row"><span class="via-legend-lead">Who decided each token:</span>'
            + viz.legend_html(labels=list(viz.TIER_COLORS)) + "</div>")


def _fmt(x, spec=".2f", suffix="") -> str:
    return f"{x:{spec}}{suffix}" if isinstance(x, (int, float)) and x == x else "—"


def _esc(x) -> str:
    """Any value from a trace, as text safe inside HTML (also inside a quoted attribute)."""
    return html.escape(str(x), quote=True)


def warn(message: str) -> None:
    """A warning toast: Gradio renders its message as HTML, so the text is escaped first."""
    gr.Warning(html.escape(str(message)))


def _ratio(a, b):
    return a / b if a and b else None


def metrics_html(traces: dict) -> str:
    """Metric cards: tokens/s, speed-up vs AR and vs SD, rejection rate, accepted length, full calls, fidelity."""
    via, sd, ar = (traces.get(m) for m in ("via", "sd", "ar"))
    if via is None and sd is None and ar is None:
        return '<div class="via-metrics-empty">Metrics appear after a run.</div>'
    tps = {m: (t.summary or {}).get("tokens_per_s") for m, t in (("via", via), ("sd", sd), ("ar", ar)) if t}
    fid = traces.get("fidelity") or {}

    def line(label, value):
        return f'<div class="via-card-sub">{label} {value}</div>'

    def card(key, title, value, subs=(), note=""):
        sub = "".join(line(a, b) for a, b in subs)
        note = f'<div class="via-card-note">{note}</div>' if note else ""
        return (f'<div class="via-card" data-metric="{key}"><div class="via-card-title">{title}</div>'
                f'<div class="via-card-value">{value}</div>{sub}{note}</div>')

    def stat(t, key, spec=".2f"):
        return _fmt((t.summary or {}).get(key), spec) if t else "—"

    main = via or sd or ar
    main_name = "VIA-SD" if via else METHOD_TITLES["sd" if sd else "ar"]
    main_tps = tps.get("via", tps.get("sd", tps.get("ar")))
    cards = [card("tokens_per_s", f"tokens / s ({main_name})", _fmt(main_tps, ".1f"),
                  [(SHORT[m], _fmt(tps[m], ".1f")) for m in ("sd", "ar") if m in tps and via])]
    vs_ar = _ratio(tps.get("via"), tps.get("ar"))
    cards.append(card("speedup_ar", "speed-up vs AR", _fmt(vs_ar, ".2f", "×"),
                      [("SD", _fmt(_ratio(tps.get("sd"), tps.get("ar")), ".2f", "×"))] if "ar" in tps else [],
                      "" if "ar" in tps else "tick “also run AR” to measure"))
    cards.append(card("speedup_sd", "speed-up vs SD", _fmt(_ratio(tps.get("via"), tps.get("sd")), ".2f", "×"),
                      note="same prompt, run one after the other"))
    cards.append(card("rejection_rate", "rejection rate", stat(main, "rejection_rate"),
                      [("SD", stat(sd, "rejection_rate"))] if via and sd else []))
    cards.append(card("mean_accepted_length", "mean accepted length", stat(main, "mean_accepted_length"),
                      [("SD", stat(sd, "mean_accepted_length"))] if via and sd else [], "tokens per round"))
    if main:
        s = main.summary or {}
        calls = f'{_esc(s.get("full_calls", 0))} <small>of {len(main.rounds)} rounds</small>'
    else:
        calls = "—"
    cards.append(card("full_calls", "full-model calls", calls,
                      [("SD", _esc((sd.summary or {}).get("full_calls", 0)))] if via and sd else []))
    via_fid = fid.get("via") or {}
    if via_fid:
        subs = [("SD", _fmt((fid.get("sd") or {}).get("agreement"), ".1%"))] if fid.get("sd") else []
        if via_fid.get("mean_logprob") is not None:
            subs.append(("mean log-prob", _fmt(via_fid.get("mean_logprob"), ".2f")))
        cards.append(card("fidelity", "fidelity (full model agrees)", _fmt(via_fid.get("agreement"), ".1%"), subs))
    else:
        cards.append(card("fidelity", "fidelity", "—", note=_esc(fid.get("note", "measured after the run"))))
    return f'<div class="via-metrics">{"".join(cards)}</div>'


def measure_fidelities(pair, traces: dict) -> dict:
    """Fidelity of VIA-SD and SD against the full model (and AR's output when it ran)."""
    return {m: measure_fidelity(pair, traces[m], reference=traces.get("ar"))
            for m in ("via", "sd") if traces.get(m) is not None and traces[m].tokens}


def panes(traces: dict, running: str | None = None, live: dict | None = None) -> tuple[str, str, str]:
    return tuple(pane_html(traces, m, running == m, (live or {}).get(m)) for m in ("via", "sd", "ar"))


FRAME_S = 1 / 15  # at most ~15 page updates a second: more than a browser shows, fewer than a fast pair makes


def stream_events(pair, prompt, method, config, stop=None):
    """The engine's fine-grained events (drafts proposed, tier decided, round recorded)."""
    from via_sd.decoding import stream_events as events  # also exported as via_sd.stream_events

    return events(pair, prompt, method, config, stop=stop)


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


# ---- live tuning: a released slider supersedes this session's run --------------------------------

_release_tickets: dict[str, int] = {}  # session -> number of its latest slider release that asked to re-run


class RunSwitch:
    """A run's stop switch: Stop was pressed, or this session released a slider (asking to re-run)
    after the run began. Another session's releases never touch it."""

    def __init__(self, stop, session: str, ticket: int | None = None):
        self.stop, self.session = stop, session
        self.ticket = _release_tickets.get(session, 0) if ticket is None else ticket

    @property
    def superseded(self) -> bool:
        return _release_tickets.get(self.session, 0) > self.ticket

    def is_set(self) -> bool:
        return self.stop.is_set() or self.superseded


def request_rerun(rerun, request: gr.Request = None):
    """At a slider release, before the queue: with "re-run on release", take a ticket. This session's
    running run (and any older release still queued) is then superseded and ends within a round.
    Returns (ticket, race area)."""
    if not rerun:
        return gr.skip(), gr.skip()
    session = _session(request)
    _release_tickets[session] = _release_tickets.get(session, 0) + 1
    return _release_tickets[session], RACE_HINT  # (ticket, race area: the last race is stale now)


# ---- handlers: run, stop, preset ----------------------------------------------------------------

@gpu
def run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route,
                with_ar, pace=0, request: gr.Request = None, progress=gr.Progress(), _ticket=None):
    """Run VIA-SD, then plain SD (then AR), streaming each pane as its tokens are decided.

    Yields (via pane, sd pane, ar pane, metrics, status, traces state).
    """
    stop = RunSwitch(run_stop(request), _session(request), _ticket)
    traces: dict = {}
    live: dict = {}  # method -> (round, candidates) of the round being verified

    def out(message, kind="run", running=None):
        return (*panes(traces, running, live), metrics_html(traces), status_html(message, kind), traces)

    if stop.is_set():  # Stop was pressed while this run waited in the queue: it never starts
        yield (gr.skip(),) * 4 + (status_html("Stopped before it started (Stop was pressed while the run "
                                              "waited in the queue).", "stop"), gr.skip())
        return
    try:
        check_prompt(prompt)
        config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed)
        yield out(f"loading {preset} … (the run starts when the models are in)" if preset not in _pairs
                  else "starting …")
        pair = wait_for_pair(preset, progress)
        apply_route(pair, preset, route)
        methods = ["via", "sd"] + (["ar"] if with_ar else [])
        pace = max(0.0, min(float(pace or 0), 2000.0)) / 1000  # slow motion: each step stays this long
        for method in methods:
            shown = 0.0
            for event in stream_events(pair, prompt, method, config, stop=stop):
                if event.kind == "round":
                    traces[method] = event.trace
                    live.pop(method, None)
                else:  # drafts proposed, or a tier decided some: shown pending / in tier colors
                    live[method] = (event.round, with_replacements(event.candidates, pair, config.greedy))
                if pace or time.perf_counter() - shown >= FRAME_S:
                    n = len(traces[method].tokens) if method in traces else 0
                    yield out(f"{METHOD_TITLES[method]}: {n} tokens …", running=method)
                    shown = time.perf_counter()
                    if pace:
                        time.sleep(pace)
            live.pop(method, None)
            yield out(f"{METHOD_TITLES[method]} done", running=None)
            if stop.is_set():
                break
        if stop.is_set():
            if stop.superseded:
                yield out("Stopped: a slider was released, so a new run with its thresholds replaces this one.",
                          "stop")
                return
            yield out("Stopped. Partial traces are kept; plots and downloads show what ran.", "stop")
            return
        yield out("measuring fidelity (one full-model pass over each output) …")
        traces["fidelity"] = measure_fidelities(pair, traces)
        yield out(_done_message(traces), "ok")
    except ValueError as err:  # UserError, or the engine refusing an input (e.g. a prompt beyond the context)
        warn(str(err))
        yield out(str(err), "error")
    except Exception as err:  # never a stack trace in the page; the log keeps it
        log.exception("run failed")
        yield out(f"Something went wrong: {type(err).__name__}: {err}", "error")


def _done_message(traces: dict) -> str:
    via, sd = traces.get("via"), traces.get("sd")
    if via and sd:
        ratio = _ratio(via.summary.get("tokens_per_s"), sd.summary.get("tokens_per_s"))
        return f"Done: VIA-SD ran at {_fmt(ratio, '.2f', '×')} the speed of plain SD on this prompt."
    return "Done."


def load_preset(preset, progress=gr.Progress()) -> tuple[str, str]:
    """Switch preset: frees the old pair, loads the new one with progress. Returns (device line, status)."""
    try:
        get_pair(preset, progress)
    except UserError as err:
        warn(str(err))
        return pair_status(preset), status_html(str(err), "error")
    except Exception as err:
        log.exception("loading %s failed", preset)
        return pair_status(preset), status_html(f"Could not load {preset}: {type(err).__name__}: {err}", "error")
    return pair_status(preset), status_html(f"{preset} loaded", "ok")


def poll_status(preset):
    """The device line while a background load runs; the timer stops once the pair is there."""
    return pair_status(preset), gr.Timer(active=preset not in _pairs and _load_state["preset"] is not None)


# ---- handlers: a better route for a pair that runs a provisional one ------------------------------

def route_search_row(preset):
    """The "search a better route" buttons show while the loaded pair runs a provisional route (never on a
    shared deployment: a search holds the model for minutes and changes the route of every visitor)."""
    pair = _pairs.get(preset)
    return gr.Row(visible=pair is not None and bool(pair.route.meta.get("provisional")) and not preset_locked())


@gpu
def search_better_route(preset, request: gr.Request = None, progress=gr.Progress()):
    """Search a measured route for the loaded pair in place of its provisional one (progress shown, Stop
    ends it, cached for next time). Returns (device line, status, route buttons row)."""
    if preset_locked():
        return (pair_status(preset), status_html(f"Route search is off here: the model is {LOCK_REASON}.", "error"),
                gr.skip())
    pair = _pairs.get(preset)
    if pair is None:
        return pair_status(preset), status_html("The models are not loaded yet.", "error"), gr.skip()
    stop = run_stop(request)  # a Stop pressed while the search waited in the queue is not lost
    try:
        route = route_for(pair, progress=lambda message, fraction: progress(fraction, desc=message), stop=stop)
    except Exception as err:
        log.exception("route search failed")
        return pair_status(preset), status_html(f"Route search failed: {type(err).__name__}: {err}", "error"), gr.skip()
    if route.meta.get("search", {}).get("stopped"):
        return pair_status(preset), status_html("Route search stopped: the provisional route stays.", "stop"), gr.skip()
    pair.set_route(route)
    _default_routes[preset] = pair.route
    return (pair_status(preset), status_html(f"Searched and cached for next time: {how_made(pair.route)}", "ok"),
            route_search_row(preset))


def stop_route_search(request: gr.Request = None) -> str:
    stop_event(request).set()
    return status_html("stopping the route search after its current step …", "stop")


# ---- handlers: views of the recorded traces -------------------------------------------------------

def views(traces: dict, theme: str = "light"):
    """Plots and the learn slider after a run or an upload.

    Returns (confidence, tier mix, latency, speed-up, acceptance by position, learn slider, learn view).
    """
    theme = theme if theme in viz.THEMES else "light"
    runs = [traces[m] for m in ("via", "sd", "ar") if traces.get(m) is not None and traces[m].tokens]
    main = next((t for t in runs if t.method != "ar"), runs[0] if runs else None)
    if main is None:
        return None, None, None, None, None, gr.Slider(minimum=1, maximum=2, value=1), learn_view(traces, 1)
    rounds = len(_learn_trace(traces).rounds) if _learn_trace(traces) else 1
    return (viz.confidence_figure(main, theme=theme), viz.tier_mix_figure(runs, theme=theme),
            viz.latency_figure(runs, theme=theme), viz.speedup_figure(runs, theme=theme),
            viz.acceptance_by_position_figure([t for t in runs if t.method != "ar"] or runs, theme=theme),
            gr.Slider(minimum=1, maximum=max(rounds, 2), value=1, step=1), learn_view(traces, 1))


def what_if_view(traces: dict, accept, escalate, signal, theme: str = "light"):
    """Re-tier the last VIA-SD trace under the slider thresholds: an ESTIMATE, no model runs.

    Returns (estimate card HTML, what-if confidence figure or None).
    """
    return what_if_card(traces, accept, escalate, signal), what_if_figure(traces, accept, escalate, signal, theme)


def _what_if_input(traces: dict, accept, escalate, signal):
    """(trace, thresholds) to re-tier, or (None, message HTML)."""
    trace = (traces or {}).get("via")
    if trace is None or not trace.rounds:
        return None, ('<div class="via-whatif" data-state="empty">Run once (or upload a VIA-SD trace): moving the '
                      'thresholds then re-tiers its recorded drafts instantly.</div>')
    try:
        return trace, make_thresholds(accept, escalate, signal)
    except UserError as err:
        return None, f'<div class="via-whatif" data-state="error">⚠ {html.escape(str(err))}</div>'


def what_if_figure(traces: dict, accept, escalate, signal, theme: str = "light"):
    """The confidence plot re-tiered under the slider thresholds (None without a VIA-SD trace)."""
    trace, th = _what_if_input(traces, accept, escalate, signal)
    if trace is None:
        return None
    return viz.confidence_figure(trace, thresholds=th, theme=theme if theme in viz.THEMES else "light")


def what_if_card(traces: dict, accept, escalate, signal) -> str:
    """The estimate card alone: under a millisecond, so it follows a slider while it moves."""
    trace, th = _what_if_input(traces, accept, escalate, signal)
    if trace is None:
        return th
    est = viz.what_if(trace, th)
    rec = est["recorded"]

    def row(name, new, old, spec="d"):
        return f"<tr><td>{name}</td><td><b>{_fmt(new, spec)}</b></td><td>{_fmt(old, spec)}</td></tr>"

    tiers = est["tier_counts"]
    rows = "".join([
        row("tokens from tier A (accepted drafts)", tiers["draft"], rec["tier_counts"]["draft"]),
        row("tokens from tier B (slim verifier)", tiers["slim"], rec["tier_counts"]["slim"]),
        row("tokens from tier C (full model)", tiers["full"], rec["tier_counts"]["full"]),
        row("full-model calls", est["full_calls"], rec["full_calls"]),
        row("slim-verifier calls", est["slim_calls"], rec["slim_calls"]),
        row("rejection rate", est["rejection_rate"], rec["rejection_rate"], ".2f"),
        row("tokens / s", est["tokens_per_s"], rec["tokens_per_s"], ".1f"),
    ])
    speed = _fmt(est["speedup_vs_recorded"], ".2f", "×")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in est["notes"])
    t = est["thresholds"]
    card = (f'<div class="via-whatif" data-state="estimate" data-accept="{t["accept"]:.2f}" '
            f'data-escalate="{t["escalate"]:.2f}"><div class="via-estimate-badge">ESTIMATE</div>'
            f'<div class="via-whatif-head">accept {t["accept"]:.2f} · escalate {t["escalate"]:.2f} · signal '
            f'{_esc(t["signal"])} → estimated speed <b>{speed}</b> of the recorded run</div>'
            f'<table><tr><th></th><th>estimate</th><th>recorded</th></tr>{rows}</table>'
            f'<div class="via-card-note">{html.escape(est["label"])}</div><ul>{notes}</ul></div>')
    return card


def rerun_on_release(rerun, prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed,
                     route, with_ar, pace=0, ticket=None, request: gr.Request = None, progress=gr.Progress()):
    """Slider released: run for real when "re-run on release" is ticked, else change nothing.
    `ticket` (from `request_rerun`): a release that a newer one of this session superseded while
    it waited in the queue does not run at all."""
    if not rerun or (ticket is not None and _release_tickets.get(_session(request), 0) > ticket):
        yield (gr.skip(),) * 6
        return
    yield from run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed,
                           route, with_ar, pace, request=request, progress=progress, _ticket=ticket)


def what_if_presets(traces: dict, accept, escalate, signal, theme: str = "light"):
    """The named threshold presets (and the sliders) placed on the last VIA-SD trace: an ESTIMATE."""
    trace = (traces or {}).get("via")
    try:
        current = make_thresholds(accept, escalate, signal).to_dict()
    except UserError:
        current = None
    presets = {name: th.to_dict() for name, th in via_sd.THRESHOLD_PRESETS.items()}
    return preset_points_figure(trace, presets, current, theme=theme if theme in viz.THEMES else "light")


# ---- threshold presets ----------------------------------------------------------------------------

CUSTOM = "custom"


def threshold_preset_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in via_sd.THRESHOLD_PRESETS] + [(CUSTOM, CUSTOM)]


def threshold_preset_info() -> str:
    about = {"paper": "the paper's rule", "fastest": "measured fastest", "lossless": "= plain SD"}
    return " · ".join(f"{name} ({about.get(name, '')}): {th.signal} {th.accept:.2f}/{th.escalate:.2f}"
                      for name, th in via_sd.THRESHOLD_PRESETS.items())


def apply_threshold_preset(name):
    """A preset chosen: its (accept, escalate, signal) go to the controls; "custom" leaves them."""
    th = via_sd.THRESHOLD_PRESETS.get(name)
    if th is None:
        return gr.skip(), gr.skip(), gr.skip()
    return th.accept, th.escalate, th.signal


# ---- race replay ----------------------------------------------------------------------------------

RACE_FPS = 12
RACE_HINT = ('<div class="via-race" data-state="empty">After a run (or an upload of traces), '
             '<b>Replay as a race</b> plays VIA-SD and plain SD side by side in the time they really took.</div>')


def _race_traces(traces: dict) -> dict:
    return {m: traces[m] for m in ("via", "sd", "ar") if (traces or {}).get(m) is not None and traces[m].rounds}


def race_ready(traces: dict, race_view: str = "") -> str:
    """The race area after a run or an upload: what can be replayed (a race already playing is left alone)."""
    if 'data-state="playing"' in (race_view or "") or 'data-state="done"' in (race_view or ""):
        return gr.skip()
    runs = _race_traces(traces)
    if not runs:
        return RACE_HINT
    names = " and ".join(METHOD_TITLES[m] for m in runs)
    return (f'<div class="via-race" data-state="ready">{html.escape(names)} recorded: press '
            f'<b>Replay as a race</b> to watch them side by side in their recorded time.</div>')


def race_replay(traces: dict, speed=1.0):
    """Plays the recorded traces side by side in their recorded time, `speed` × faster (frames of HTML)."""
    runs = _race_traces(traces)
    if not runs:
        yield RACE_HINT
        return
    try:
        speed = min(max(float(speed), 0.05), 50.0)
    except (TypeError, ValueError):
        speed = 1.0
    end = race_end_ms(runs)
    start = time.perf_counter()
    while (t := (time.perf_counter() - start) * 1000 * speed) < end:
        yield race_html(runs, t, speed)
        time.sleep(1 / RACE_FPS)
    yield race_html(runs, end, speed)


def trace_table(traces: dict, method: str = "via", request: gr.Request = None):
    """Trace tab: (table rows, JSON file, CSV file) of the chosen method's trace."""
    import pandas as pd

    trace = (traces or {}).get(method)
    columns = ["i", "text", "round", "tier", "outcome", "p_draft", "q_slim", "q_full", "confidence", "id"]
    if trace is None:
        return pd.DataFrame(columns=columns), None, None
    rows = [{c: round(t[c], 4) if isinstance(t.get(c), float) else t.get(c) for c in columns} for t in trace.tokens]
    folder = download_dir(request)
    json_path, csv_path = folder / f"via-sd-trace-{method}.json", folder / f"via-sd-trace-{method}.csv"
    _write(json_path, trace.to_json(indent=1))
    _write(csv_path, trace.to_csv())
    return pd.DataFrame(rows, columns=columns), str(json_path), str(csv_path)


_downloads: dict = {}  # "root": this process's one temp folder for downloads, made on first use
_downloads_lock = threading.Lock()


def download_dir(request=None) -> Path:
    """This session's folder for download files, inside one temp folder per process that is removed at
    exit; a refresh overwrites the session's files instead of making a new folder."""
    with _downloads_lock:
        if "root" not in _downloads:
            _downloads["root"] = Path(tempfile.mkdtemp(prefix="via-sd-"))
            atexit.register(shutil.rmtree, _downloads["root"], ignore_errors=True)
        folder = _downloads["root"] / _session_folder(request)
        folder.mkdir(exist_ok=True)
    return folder


def _session_folder(request) -> str:
    # the session hash comes from the client: hashed, it can never name another path
    return hashlib.sha256(_session(request).encode()).hexdigest()[:20]


def forget_session(request: gr.Request = None) -> None:
    """A visitor left the page (`demo.unload`): drop their download files and their Stop switch."""
    _stops.pop(_session(request), None)
    if "root" in _downloads:
        shutil.rmtree(_downloads["root"] / _session_folder(request), ignore_errors=True)


def _write(path: Path, text: str) -> None:
    """Write via a temporary file, so a download running meanwhile never reads half a file."""
    part = path.with_name(f".{path.name}.{threading.get_ident()}")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def check_trace(trace: Trace) -> None:
    """Raises ValueError unless every view of the app can draw `trace` (an upload is untrusted; its
    fields passed `via_sd.trace_check` already, this catches what only drawing finds)."""
    traces = {trace.method: trace}
    try:
        pane_html(traces, trace.method)
        metrics_html(traces)
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
    if len(files) > len(METHOD_TITLES):
        raise UserError(f"{len(files)} files: upload at most {len(METHOD_TITLES)} traces (one per method) at once.")
    traces = {}
    for f in files:
        path = Path(getattr(f, "name", f))
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            raise UserError(f"{path.name} is larger than {MAX_UPLOAD_BYTES // 2**20} MB: not a trace this app reads.")
        try:
            text = path.read_bytes().decode("utf-8")
            # the gate: size and nesting depth before parsing, then every field (via_sd.trace_check)
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

    Returns (via pane, sd pane, ar pane, metrics, status, traces state).
    """
    try:
        traces = read_traces(files)
    except UserError as err:
        warn(str(err))
        return (gr.skip(),) * 4 + (status_html(str(err), "error"), gr.skip())
    traces["fidelity"] = {"note": "not measured for an uploaded trace"}
    names = ", ".join(METHOD_TITLES[m] for m in traces if m in METHOD_TITLES)
    return (*panes(traces), metrics_html(traces), status_html(f"Replaying uploaded trace: {names}", "ok"), traces)


# ---- learn: one round at a time -------------------------------------------------------------------

def _learn_trace(traces: dict):
    for m in ("via", "sd"):
        if (traces or {}).get(m) is not None and traces[m].rounds:
            return traces[m]
    return None


def _q(text: str) -> str:
    return "«" + html.escape(viz.visible_text(text or "")) + "»"


def explain_candidate(c: dict, trace, emitted: list[dict], first_full: int | None, replaced_at: int | None) -> str:
    """One plain-language sentence from the numbers: why this draft got its tier and decision."""
    pos, decision, tier = c.get("pos", 0), c.get("decision"), c.get("tier")
    out = emitted[pos] if pos < len(emitted) else None
    verdict = {"kept": "agreed, so the draft stays",
               "replaced": f"disagreed and put in {_q(out['text']) if out else 'its own token'}, which ends the round"}
    did = verdict.get(decision, _esc(decision))
    if decision == "discarded":
        if replaced_at is not None and pos > replaced_at:
            return f"Discarded: draft #{replaced_at + 1} was replaced, so this draft no longer continues the text."
        return "Not used: the token budget or the end of the text was reached."
    if trace.method == "sd":
        return f"Plain SD: the full model checks every draft; it {did}."
    th = (trace.config or {}).get("thresholds") or {}
    a, e = th.get("accept", float("nan")), th.get("escalate", float("nan"))
    r = c.get("confidence")
    name = "Drafter probability" if th.get("signal") == "draft" else "Confidence"
    r_txt = _fmt(r)
    if tier == "draft":
        return f"{name} {r_txt} ≥ accept {_fmt(a)}: tier A, accepted without any verifier."
    if tier == "slim":
        return f"{name} {r_txt} lies between escalate {_fmt(e)} and accept {_fmt(a)}: tier B, the slim verifier {did}."
    if first_full is not None and pos > first_full and isinstance(r, (int, float)) and r >= e:
        return (f"After draft #{first_full + 1} escalated, the full model checks every later draft too "
                f"({name.lower()} {r_txt}): it {did}.")
    return f"{name} {r_txt} < escalate {_fmt(e)}: tier C, deferred to the full model, which {did}."


def learn_view(traces: dict, k=1) -> str:
    """Round k (1-based, as on the slider) of the last VIA-SD trace (SD if none): what was drafted, each
    tier's decision and why."""
    trace = _learn_trace(traces)
    if trace is None:
        return ('<div class="via-learn" data-state="empty">Run once (or upload a trace) to step through its '
                'rounds.</div>')
    try:
        k = check_round(k, len(trace.rounds)) - 1
    except UserError as err:
        return f'<div class="via-learn" data-state="error">⚠ {_esc(err)}</div>'
    rnd = trace.rounds[k]
    cands = rnd.get("candidates", [])
    emitted = [t for t in trace.tokens if t.get("round") == rnd.get("round")]
    before = "".join(t.get("text", "") for t in trace.tokens if t.get("round", 0) < rnd.get("round", k))
    first_full = next((c["pos"] for c in cands if c.get("tier") == "full"), None) if trace.method == "via" else None
    replaced_at = next((c["pos"] for c in cands if c.get("decision") == "replaced"), None)

    rows = []
    for c in cands:
        label = viz.candidate_label(c)
        color = viz.CANDIDATE_COLORS[label]
        chip = (f'<span class="via-chip" style="background:{color};color:{viz.text_color(color)}">'
                f'{html.escape(viz.visible_text(c.get("text", "")))}</span>')
        rows.append(f'<tr data-decision="{_esc(c.get("decision"))}"><td>{_esc(c.get("pos", 0) + 1)}</td><td>{chip}</td>'
                    f'<td>{_fmt(c.get("p_draft"), ".3f")}</td><td>{_fmt(c.get("q_slim"), ".3f")}</td>'
                    f'<td>{_fmt(c.get("q_full"), ".3f")}</td><td>{_fmt(c.get("confidence"), ".3f")}</td>'
                    f'<td>{html.escape(label)}</td>'
                    f'<td class="via-why">{explain_candidate(c, trace, emitted, first_full, replaced_at)}</td></tr>')
    bonus = [t for t in emitted if t.get("outcome") == "bonus"]
    if bonus:
        who = {"slim": "the slim verifier", "full": "the full model"}.get(bonus[0].get("tier"), "the verifier")
        bonus_txt = (f"<p>Every draft was kept, so {who} added one token of its own for free: "
                     f"{_q(bonus[0].get('text', ''))} (the bonus token).</p>")
    else:
        bonus_txt = ""
    tiers = [c.get("tier") for c in cands]
    full_ms = rnd.get("full_ms") or 0.0
    summary = (f"The drafter proposed {len(cands)} token(s) in {_fmt(rnd.get('draft_ms', 0.0), '.0f')} ms. "
               f"{tiers.count('draft')} went to tier A (kept as drafted), {tiers.count('slim')} to tier B (slim "
               f"verifier, {_fmt(rnd.get('slim_ms', 0.0), '.0f')} ms), {tiers.count('full')} to tier C (full model). "
               + (f"The full model ran ({_fmt(full_ms, '.0f')} ms)." if rnd.get("full_called") else
                  "The full model did not run this round.")
               + f" {len(emitted)} token(s) were emitted.")
    if trace.method == "ar":
        summary = "Autoregressive: the full model emits one token per round; nothing is drafted."
    emitted_chips = viz.token_html(Trace(method=trace.method, prompt="", tokens=emitted, config=trace.config),
                                   legend=False)
    return (f'<div class="via-learn" data-state="round" data-round="{k}"><h3>{METHOD_TITLES[trace.method]} · round '
            f'{k + 1} of {len(trace.rounds)}</h3><p class="via-learn-summary">{summary}</p>'
            f'<div class="via-learn-context"><b>Text so far</b> …{html.escape(before[-160:])}</div>'
            f'<table class="via-learn-table"><tr><th>#</th><th>draft</th><th>p draft</th><th>q slim</th>'
            f'<th>q full</th><th>r</th><th>what happened</th><th>why</th></tr>{"".join(rows)}</table>'
            f'{bonus_txt}<div><b>Emitted this round</b></div>{emitted_chips}</div>')


def check_round(k, rounds: int) -> int:
    """The learn round `k` (1-based) as an int, or UserError saying which rounds exist."""
    valid = isinstance(k, (int, float)) and not isinstance(k, bool) and k == k and float(k).is_integer()
    if not valid or not 1 <= k <= rounds:
        raise UserError(f"Round {str(k)[:20]} does not exist: this trace has {rounds} round(s); pick a whole "
                        f"number from 1 to {rounds}.")
    return int(k)


def step_round(k, delta, traces: dict) -> int:
    """The learn slider's next value (1-based), clamped to the recorded rounds."""
    trace = _learn_trace(traces)
    last = len(trace.rounds) if trace else 1
    return max(1, min(int(k or 1) + int(delta), last))


# ---- threshold lab: a measured sweep --------------------------------------------------------------

MAX_GRID = 24  # settings in one measured sweep
MAX_GRID_CHARS = 400  # characters in one grid field: checked before the text is parsed


def parse_grid(text: str, name: str) -> list[float]:
    if not isinstance(text, (str, int, float)) or isinstance(text, bool) or len(str(text)) > MAX_GRID_CHARS:
        raise UserError(f"{name}: write at most {MAX_GRID_CHARS} characters of numbers between 0 and 1 separated "
                        "by commas, e.g. 0.3, 0.6, 0.9")
    try:
        values = sorted({round(float(v), 4) for v in str(text).replace(";", ",").split(",") if v.strip()})
    except ValueError:
        raise UserError(f"{name}: write numbers between 0 and 1 separated by commas, e.g. 0.3, 0.6, 0.9") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise UserError(f"{name}: write numbers between 0 and 1 separated by commas, e.g. 0.3, 0.6, 0.9")
    return values


def grid_size(accept_values: list[float], escalate_values: list[float]) -> int:
    """How many (accept, escalate) settings have escalate <= accept: counted from the sorted values, so
    a huge grid is refused before it is built."""
    return sum(bisect.bisect_right(escalate_values, a + 1e-9) for a in accept_values)


@gpu
def measure_sweep(prompt, preset, gamma, signal, temperature, max_new_tokens, seed, route, accepts, escalates,
                  accept, escalate, theme="light", request: gr.Request = None, progress=gr.Progress()):
    """Run VIA-SD for real at every (accept, escalate) of the grid and plain SD on the same prompt
    (`via_sd.bench.run_sweep`, interleaved). Returns (frontier figure, status, sweep points).

    Speed-up is over plain SD, fidelity the full model's top-1 agreement with the output.
    """
    theme = theme if theme in viz.THEMES else "light"
    stop = run_stop(request)
    if stop.is_set():  # Stop was pressed while the sweep waited in the queue
        return gr.skip(), status_html("Sweep stopped before it started (Stop was pressed while it waited in the "
                                      "queue).", "stop")
    try:
        check_prompt(prompt)
        accept_values, escalate_values = parse_grid(accepts, "accept values"), parse_grid(escalates, "escalate values")
        size = grid_size(accept_values, escalate_values)
        if not size:
            raise UserError("No (accept, escalate) pair in the grid has escalate ≤ accept.")
        if size > MAX_GRID:
            raise UserError(f"The grid has {size:,} settings; keep it to {MAX_GRID} or fewer.")
        config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed)
        pair = get_pair(preset, progress)
        apply_route(pair, preset, route)
        result = run_sweep(pair, [{"task": "app", "prompt": prompt}], config, accept=accept_values,
                           escalate=escalate_values, signals=[config.thresholds.signal], repeats=1, warmup=1,
                           progress=lambda message, fraction: progress(fraction, desc=message), stop=stop)
        if result["sd"] is None:
            return gr.skip(), status_html("Sweep stopped before plain SD was measured: nothing to show.", "stop")
        points = result["points"] + [{**result["sd"], "label": "plain SD"}]
        current = {"accept": float(accept), "escalate": float(escalate), "signal": config.thresholds.signal}
        figure = viz.frontier_figure(points, current=current, theme=theme, baseline="SD")
        best = result.get("best")
        tip = (f" Fastest with ≥95% agreement: accept {best['accept']:.2f}, escalate {best['escalate']:.2f} "
               f"({best['speedup']:.2f}× SD)." if best else " No setting reached 95% agreement.")
        if result.get("stopped"):
            return figure, status_html(f"Sweep stopped: {len(result['points'])} of {size} settings measured "
                                       "(shown) against plain SD on this prompt.", "stop")
        return figure, status_html(f"Sweep done: {size} settings measured against plain SD "
                                   f"({result['sd']['tokens_per_s']:.1f} tokens/s) on this prompt.{tip}", "ok")
    except UserError as err:
        warn(str(err))
        return None, status_html(str(err), "error")
    except Exception as err:
        log.exception("sweep failed")
        return None, status_html(f"Sweep failed: {type(err).__name__}: {err}", "error")


# ---- layout ---------------------------------------------------------------------------------------

def example_prompts() -> tuple[list[list[str]], list[str]]:
    """Two prompts per task from assets/prompts/mixed.jsonl, labelled by task."""
    examples, labels = [], []
    path = ASSETS / "prompts" / "mixed.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if line.strip():
            item = json.loads(line)
            examples.append([item["prompt"]])
            short = item["prompt"].split("\n")[0]
            short = short.removeprefix("Solve step by step: ").removeprefix("Translate the following text ")
            labels.append(f"{item['task']}: {short[:24]}{'…' if len(short) > 24 else ''}")
    return examples, labels


INTRO = """# VIA-SD Studio
A small **drafter** proposes tokens; a **slim verifier** (the big model with some sub-layers skipped)
handles the medium-confidence ones; only uncertain tokens go to the **full model**.
Tokens are colored by who decided them — hover one for its numbers."""


def build_demo(preset: str = DEFAULT_PRESET) -> gr.Blocks:
    examples, labels = example_prompts()
    _served["preset"] = preset
    # Gradio copies every served file into its own cache: hourly, drop copies older than an hour
    with gr.Blocks(title="VIA-SD Studio", fill_width=True, delete_cache=(3600, 3600)) as demo:
        traces = gr.State({})
        theme = gr.Textbox(value="light", visible="hidden", elem_id="theme")

        with gr.Sidebar(label="Settings", width=340, elem_id="settings"):
            gr.Markdown("### Settings")
            threshold_preset = gr.Radio(threshold_preset_choices(), value=DEFAULT_THRESHOLD_PRESET,
                                        label="threshold preset", info=threshold_preset_info(),
                                        elem_id="threshold-preset")
            accept = gr.Slider(0, 1, value=DEFAULTS["accept"], step=0.01, label="accept",
                               info="tier A: confidence ≥ accept keeps the draft, no verifier", elem_id="accept")
            escalate = gr.Slider(0, 1, value=DEFAULTS["escalate"], step=0.01, label="escalate",
                                 info="tier C: confidence < escalate asks the full model", elem_id="escalate")
            signal = gr.Radio([("slim verifier r = q′(x)/max q′", "slim"), ("drafter p(x)", "draft")],
                              value=DEFAULTS["signal"], label="whose confidence sorts the tiers", elem_id="signal")
            gamma = gr.Slider(1, 16, value=DEFAULTS["gamma"], step=1, label="gamma (drafts per round)",
                              elem_id="gamma")
            max_new_tokens = gr.Slider(8, 512, value=DEFAULTS["max_new_tokens"], step=8, label="max new tokens",
                                       elem_id="max-new-tokens")
            temperature = gr.Slider(0, 2, value=DEFAULTS["temperature"], step=0.05, label="temperature (0 = greedy)",
                                    elem_id="temperature")
            seed = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed", elem_id="seed")
            route = gr.Dropdown(route_choices(), value="default", label="slim verifier route", elem_id="route")
            with_ar = gr.Checkbox(False, label="also run AR (the full model alone; slow)", elem_id="with-ar")
            presentation = gr.Checkbox(False, label="presentation mode (large type)", elem_id="presentation")
            pace = gr.Slider(0, 1000, value=0, step=50, label="slow motion (ms each step stays on screen)",
                             info="0 = live speed; timings exclude the pauses", elem_id="pace")

        gr.Markdown(INTRO, elem_id="intro")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=4, max_lines=12, elem_id="prompt",
                                    placeholder="Ask something, or pick an example below")
                gr.Examples(examples, inputs=[prompt], example_labels=labels, label="Examples by task",
                            cache_examples=False, examples_per_page=10, elem_id="examples")
            with gr.Column(scale=2, min_width=300):
                locked = preset_locked()
                model = gr.Dropdown(preset_choices(), value=preset, label="Model preset", elem_id="preset",
                                    interactive=not locked, info=LOCK_REASON.capitalize() if locked else None)
                device = gr.Markdown(pair_status(preset), elem_id="device")
                with gr.Row(visible=False, elem_id="route-search-row") as route_row:
                    route_search = gr.Button("Search a better route", elem_id="route-search", size="sm")
                    route_search_stop = gr.Button("Stop search", elem_id="route-search-stop", size="sm",
                                                  variant="stop")
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="run")
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
                status = gr.HTML(status_html("VIA-SD, plain SD (and AR) run one after another on the same prompt, "
                                             "so their timings are comparable."), elem_id="status")

        gr.HTML(legend_html(), elem_id="legend", js_on_load=None)
        with gr.Row(equal_height=False):
            via_pane = gr.HTML(pane_html({}, "via"), elem_id="via-tokens", container=True, padding=True,
                               js_on_load=None)
            sd_pane = gr.HTML(pane_html({}, "sd"), elem_id="sd-tokens", container=True, padding=True,
                              js_on_load=None)
            ar_pane = gr.HTML(pane_html({}, "ar"), elem_id="ar-tokens", container=True, padding=True,
                              js_on_load=None, visible=False)
        metrics = gr.HTML(metrics_html({}), elem_id="metrics", js_on_load=None)
        with gr.Row(equal_height=True, elem_id="race-controls"):
            race = gr.Button("▶ Replay as a race", elem_id="race-replay", scale=0, min_width=220)
            race_speed = gr.Radio([("¼×", 0.25), ("½×", 0.5), ("1×", 1.0), ("2×", 2.0), ("4×", 4.0)], value=1.0,
                                  label="race speed (× recorded time)", elem_id="race-speed", scale=1)
        race_view = gr.HTML(RACE_HINT, elem_id="race-view", js_on_load=None)

        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Confidence", id="tab-confidence"):
                confidence_plot = gr.Plot(label="confidence vs thresholds", elem_id="confidence-plot", show_label=False)
                tier_mix_plot = gr.Plot(label="who produced each token", elem_id="tier-mix-plot", show_label=False)
            with gr.Tab("Latency", id="tab-latency"):
                latency_plot = gr.Plot(label="latency per round", elem_id="latency-plot", show_label=False)
            with gr.Tab("Speed-up", id="tab-speedup"):
                speedup_plot = gr.Plot(label="speed-up", elem_id="speedup-plot", show_label=False)
                position_plot = gr.Plot(label="acceptance by draft position", elem_id="position-plot", show_label=False)
            with gr.Tab("Threshold lab", id="tab-lab"):
                gr.Markdown("Move **accept** / **escalate** in the settings: the last VIA-SD trace is re-tiered "
                            "at once. That is an **estimate** (its recorded drafts, not a new run). Tick the box "
                            "to re-run for real when you release a slider.")
                rerun = gr.Checkbox(False, label="re-run on release", elem_id="rerun-on-release")
                whatif = gr.HTML(what_if_view({}, DEFAULTS["accept"], DEFAULTS["escalate"], DEFAULTS["signal"])[0],
                                 elem_id="whatif", js_on_load=None)
                whatif_plot = gr.Plot(label="what-if: re-tiered drafts (estimate)", elem_id="whatif-plot",
                                      show_label=False)
                presets_plot = gr.Plot(label="what-if: threshold presets (estimate)", elem_id="whatif-presets-plot",
                                       show_label=False)
                gr.Markdown("**Measured sweep**: runs plain SD and VIA-SD at every grid point for real on the "
                            "prompt, interleaved (slow on a CPU: keep the grid and max new tokens small).")
                with gr.Row():
                    sweep_accepts = gr.Textbox("0.3, 0.6, 0.9", label="accept values", elem_id="sweep-accepts")
                    sweep_escalates = gr.Textbox("0.0, 0.2", label="escalate values", elem_id="sweep-escalates")
                    sweep = gr.Button("Measure sweep", elem_id="sweep")
                frontier_plot = gr.Plot(label="speed-up vs fidelity", elem_id="frontier-plot", show_label=False)
            with gr.Tab("Trace", id="tab-trace"):
                with gr.Row():
                    trace_method = gr.Radio([("VIA-SD", "via"), ("plain SD", "sd"), ("AR", "ar")], value="via",
                                            label="trace", elem_id="trace-method")
                    json_download = gr.DownloadButton("Download JSON", elem_id="trace-download")
                    csv_download = gr.DownloadButton("Download CSV", elem_id="trace-csv")
                upload = gr.File(label="Replay a trace: upload a JSON file saved here (no model needed)",
                                 file_count="multiple", file_types=[".json"], elem_id="trace-upload")
                table = gr.Dataframe(label="emitted tokens", elem_id="trace-table", interactive=False,
                                     max_height=420)
            with gr.Tab("Learn", id="tab-learn"):
                gr.Markdown("Step through the last run one round at a time: what the drafter proposed, which "
                            "tier each draft went to, and why.")
                with gr.Row():
                    prev_round = gr.Button("◀ Prev", elem_id="learn-prev", scale=0)
                    learn_round = gr.Slider(1, 2, value=1, step=1, label="round", elem_id="learn-round", scale=4)
                    learn_api_round = gr.Number(1, label="round", precision=None, visible=False)
                    next_round = gr.Button("Next ▶", elem_id="learn-next", scale=0)
                learn = gr.HTML(learn_view({}), elem_id="learn-view", js_on_load=None)

        # ---- events -------------------------------------------------------------------------------
        run_inputs = [prompt, model, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar,
                      pace]
        ticket = gr.State(None)
        run_outputs = [via_pane, sd_pane, ar_pane, metrics, status, traces]
        view_outputs = [confidence_plot, tier_mix_plot, latency_plot, speedup_plot, position_plot, learn_round, learn]
        whatif_inputs = [traces, accept, escalate, signal, theme]
        light = dict(concurrency_limit=8, show_progress="hidden")

        def after_run(event):
            """Plots, trace tab and what-if follow every run and every upload."""
            return (event.then(views, [traces, theme], view_outputs, api_name=False, **light)
                    .then(trace_table, [traces, trace_method], [table, json_download, csv_download],
                          api_name=False, **light)
                    .then(what_if_view, whatif_inputs, [whatif, whatif_plot], api_name=False, **light)
                    .then(what_if_presets, whatif_inputs, [presets_plot], api_name=False, **light)
                    .then(race_ready, [traces, race_view], [race_view], api_name=False, **light))

        demo.load(None, None, theme, js=THEME_JS)
        demo.unload(forget_session)
        timer = gr.Timer(0.5, active=_load_state["preset"] is not None or preset not in _pairs)
        timer.tick(poll_status, [model], [device, timer], api_name=False, show_progress="hidden")
        model.change(load_preset, [model], [device, status], api_name="load_preset", concurrency_id="gpu",
                     concurrency_limit=1).then(route_search_row, [model], [route_row], api_name=False,
                                               show_progress="hidden")

        for trigger in (run.click, prompt.submit, upload.upload):  # new traces make the last race stale
            trigger(lambda: RACE_HINT, None, race_view, api_name=False, queue=False)
        started = run.click(None, None, theme, js=THEME_JS).then(
            run_compare, run_inputs, run_outputs, api_name="run", concurrency_id="gpu", concurrency_limit=1,
            validator=on_enqueue(run_compare), show_progress_on=[via_pane, sd_pane])
        after_run(started)
        after_run(prompt.submit(None, None, theme, js=THEME_JS).then(
            run_compare, run_inputs, run_outputs, api_name=False, concurrency_id="gpu", concurrency_limit=1,
            validator=on_enqueue(run_compare), show_progress_on=[via_pane, sd_pane]))
        stop.click(stop_run, None, status, api_name="stop", concurrency_limit=None, queue=False)
        with_ar.change(lambda on: gr.HTML(visible=bool(on)), [with_ar], [ar_pane], api_name=False, queue=False)
        presentation.change(None, [presentation], None, js=PRESENTATION_JS)

        card_inputs = [traces, accept, escalate, signal]
        for control in (accept, escalate, signal):
            # the card first (instant), then the slower re-drawn plot
            control.change(what_if_card, card_inputs, [whatif], api_name="what_if" if control is accept else False,
                           trigger_mode="always_last", **light).then(
                what_if_figure, whatif_inputs, [whatif_plot], api_name=False, trigger_mode="always_last", **light).then(
                what_if_presets, whatif_inputs, [presets_plot], api_name=False, trigger_mode="always_last", **light)
        threshold_preset.input(apply_threshold_preset, [threshold_preset], [accept, escalate, signal],
                               api_name=False, queue=False)
        for control in (accept, escalate, signal):  # a hand on a control makes the setting custom
            control.input(None, None, threshold_preset, js=f"() => '{CUSTOM}'")
        for slider in (accept, escalate):  # the ticket is taken before the queue, so the running run ends at once
            after_run(slider.release(request_rerun, [rerun], [ticket, race_view], api_name=False, queue=False,
                                     trigger_mode="multiple").then(
                rerun_on_release, [rerun, *run_inputs, ticket], run_outputs, api_name=False,
                concurrency_id="gpu", concurrency_limit=1, validator=on_enqueue(rerun_on_release),
                trigger_mode="always_last", show_progress_on=[via_pane, sd_pane]))  # a release during a run runs once that run has stopped
        race.click(race_replay, [traces, race_speed], [race_view], api_name="race", **light)
        demo.load(poll_status, [model], [device, timer], api_name=False, show_progress="hidden").then(
            route_search_row, [model], [route_row], api_name=False, show_progress="hidden")
        timer.tick(route_search_row, [model], [route_row], api_name=False, show_progress="hidden")
        route_search.click(search_better_route, [model], [device, status, route_row], api_name="search_route",
                           concurrency_id="gpu", concurrency_limit=1, validator=on_enqueue(search_better_route))
        route_search_stop.click(stop_route_search, None, status, api_name=False, queue=False)

        sweep.click(None, None, theme, js=THEME_JS).then(
            measure_sweep, [prompt, model, gamma, signal, temperature, max_new_tokens, seed, route, sweep_accepts,
                            sweep_escalates, accept, escalate, theme], [frontier_plot, status],
            api_name="sweep", concurrency_id="gpu", concurrency_limit=1, validator=on_enqueue(measure_sweep))

        trace_method.change(trace_table, [traces, trace_method], [table, json_download, csv_download],
                            api_name="trace_files", **light)
        after_run(upload.upload(replay_upload, [upload], run_outputs, api_name="replay", **light))

        learn_round.change(learn_view, [traces, learn_round], [learn], api_name=False, **light)
        # the API's own round input: the slider's range (1-2 until the page's follow-up steps widen it) would
        # refuse valid rounds; learn_view itself accepts exactly the rounds of the trace
        learn_api_round.change(learn_view, [traces, learn_api_round], [learn], api_name="learn", **light)
        prev_round.click(lambda k, t: step_round(k, -1, t), [learn_round, traces], [learn_round], api_name=False,
                         **light)
        next_round.click(lambda k, t: step_round(k, 1, t), [learn_round, traces], [learn_round], api_name=False,
                         **light)
    return demo


def launch(preset: str = DEFAULT_PRESET, **kwargs):
    """Start the page at once and load `preset` in the background."""
    preload(preset)
    demo = build_demo(preset)
    demo.queue(default_concurrency_limit=1, max_size=64)
    css_paths = sorted(ASSETS.glob("*.css"))
    kwargs.setdefault("max_file_size", MAX_UPLOAD_BYTES)  # the server refuses a larger upload before storing it
    return demo.launch(css_paths=css_paths, theme=gr.themes.Soft(), **kwargs)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
           server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
