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

import gc
import html
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
import torch

import viz
from via_sd import PRESETS, DecodeConfig, ModelLoadError, Thresholds, Trace, generate, load_pair, stream
from via_sd.bench import run_sweep
from via_sd.fidelity import measure_fidelity
from via_sd.routing import shipped_routes

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
DEFAULTS = {"gamma": 5, "accept": Thresholds().accept, "escalate": Thresholds().escalate,
            "signal": Thresholds().signal, "temperature": 0.0, "max_new_tokens": 64, "seed": 0}
# One theme check for every event that draws figures: Gradio marks dark mode with body.dark.
THEME_JS = "() => document.body.classList.contains('dark') ? 'dark' : 'light'"
PRESENTATION_JS = "(on) => { document.body.classList.toggle('presentation', !!on); return []; }"


class UserError(ValueError):
    """Bad input: shown in the page as a plain message, never as a stack trace."""


# ---- models: one loaded pair, shared by every session -------------------------------------------

_pairs: dict = {}  # preset -> ModelPair; at most one entry, so switching frees the old pair
_pairs_lock = threading.Lock()
_load_state = {"preset": None, "error": None}  # what is loading now / why the last load failed


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


def get_pair(preset: str, progress=None):
    """The loaded pair of `preset`, loading it (and freeing any other) on first use."""
    ok, why = preset_available(preset)
    if not ok:
        raise UserError(why)
    with _pairs_lock:
        if preset in _pairs:
            return _pairs[preset]
        free_pairs()
        _load_state.update(preset=preset, error=None)

        def report(message: str, fraction: float) -> None:
            if progress is not None:
                progress(fraction, desc=f"{preset}: {message}")

        try:
            pair = load_pair(preset, progress=report)
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

    threading.Thread(target=work, name=f"preload-{preset}", daemon=True).start()


def pair_status(preset: str) -> str:
    """One line next to the preset: device, dtype, models and route, or what is happening."""
    pair = _pairs.get(preset)
    if pair is not None:
        route = pair.route
        skipped = f"skips {len(route.skip)} sub-layers ({route.skip_fraction:.0%})" if route.skip else "skips nothing"
        return (f"**{pair.device.type}** · {str(pair.dtype).replace('torch.', '')} · {pair.drafter_name} → "
                f"{pair.verifier_name} · slim route `{route.name}` {skipped}")
    if _load_state["preset"] == preset:
        return f"loading **{preset}** … (the first Run waits for it)"
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
    wanted = PRESETS[preset]["route"] if route in (None, "", "default") else route
    wanted = wanted or "none"
    if pair.route.name == wanted:
        return
    try:
        pair.set_route(wanted)
    except (ValueError, OSError) as err:
        raise UserError(f"route {wanted!r} does not fit this verifier: {err}") from err


# ---- per-session stop switches -------------------------------------------------------------------

_stops: dict[str, threading.Event] = {}


def _session(request) -> str:
    return getattr(request, "session_hash", None) or "local"


def stop_event(request=None) -> threading.Event:
    return _stops.setdefault(_session(request), threading.Event())


def stop_run(request: gr.Request = None) -> str:
    """Stop: the engine checks the switch between rounds, so this session's run ends within a round."""
    stop_event(request).set()
    return "⏹ stopping after the current round …"


# ---- input checking ------------------------------------------------------------------------------

def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("The prompt is empty: type a prompt or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}. "
                        "Shorten it.")
    return prompt


def make_thresholds(accept, escalate, signal="slim") -> Thresholds:
    try:
        return Thresholds(accept=float(accept), escalate=float(escalate), signal=signal or "slim")
    except (TypeError, ValueError) as err:
        raise UserError(f"Thresholds: {err}") from err


def make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed) -> DecodeConfig:
    thresholds = make_thresholds(accept, escalate, signal)
    try:
        return DecodeConfig(gamma=int(gamma), max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                            seed=int(seed), thresholds=thresholds)
    except (TypeError, ValueError) as err:
        raise UserError(f"Settings: {err}") from err


def status_html(message: str, kind: str = "info") -> str:
    # plain symbols, not emoji: they render with any font (a projector PC may have no emoji font)
    icon = {"info": "ⓘ", "ok": "✓", "error": "⚠", "run": "…", "stop": "■"}.get(kind, "")
    return (f'<div class="via-status via-status-{kind}" role="status" data-kind="{kind}">'
            f'<span class="via-status-icon">{icon}</span> {html.escape(message)}</div>')


# ---- rendering (all drawing is viz's; this only frames it) ----------------------------------------

def pane_html(traces: dict, method: str, running: bool = False) -> str:
    """One output pane: a header with live counts and the tier-colored tokens (hover for details)."""
    trace = traces.get(method)
    title = f'<div class="via-pane-title"><b>{METHOD_TITLES[method]}</b> <span>{METHOD_ABOUT[method]}</span></div>'
    if trace is None:
        hint = ("Press Run: VIA-SD runs first, then plain SD (then AR if ticked), one after another so "
                "their timings are comparable." if method == "via" else "Waits for the run before it.")
        return f'{title}<div class="via-pane-empty">{hint}</div>'
    s = trace.summary or {}
    state = "running …" if running else ("stopped" if s.get("stopped") else "done")
    counts = (f'<div class="via-pane-counts" data-state="{state}">{s.get("new_tokens", 0)} tokens · '
              f'{s.get("tokens_per_s", 0.0):.1f} tokens/s · {len(trace.rounds)} rounds · {state}</div>')
    return title + counts + viz.token_html(trace, legend=False)


def legend_html() -> str:
    """One legend for every pane: what each token color means."""
    return ('<div class="via-legend-row"><span class="via-legend-lead">Who decided each token:</span>'
            + viz.legend_html(labels=list(viz.TIER_COLORS)) + "</div>")


def _fmt(x, spec=".2f", suffix="") -> str:
    return f"{x:{spec}}{suffix}" if isinstance(x, (int, float)) and x == x else "—"


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
        calls = f'{s.get("full_calls", 0)} <small>of {len(main.rounds)} rounds</small>'
    else:
        calls = "—"
    cards.append(card("full_calls", "full-model calls", calls,
                      [("SD", f'{(sd.summary or {}).get("full_calls", 0)}')] if via and sd else []))
    via_fid = fid.get("via") or {}
    if via_fid:
        subs = [("SD", _fmt((fid.get("sd") or {}).get("agreement"), ".1%"))] if fid.get("sd") else []
        if via_fid.get("mean_logprob") is not None:
            subs.append(("mean log-prob", _fmt(via_fid.get("mean_logprob"), ".2f")))
        cards.append(card("fidelity", "fidelity (full model agrees)", _fmt(via_fid.get("agreement"), ".1%"), subs))
    else:
        cards.append(card("fidelity", "fidelity", "—", note=fid.get("note", "measured after the run")))
    return f'<div class="via-metrics">{"".join(cards)}</div>'


def measure_fidelities(pair, traces: dict) -> dict:
    """Fidelity of VIA-SD and SD against the full model (and AR's output when it ran)."""
    return {m: measure_fidelity(pair, traces[m], reference=traces.get("ar"))
            for m in ("via", "sd") if traces.get(m) is not None and traces[m].tokens}


def panes(traces: dict, running: str | None = None) -> tuple[str, str, str]:
    return tuple(pane_html(traces, m, running == m) for m in ("via", "sd", "ar"))


# ---- handlers: run, stop, preset ----------------------------------------------------------------

@gpu
def run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route,
                with_ar, request: gr.Request = None, progress=gr.Progress()):
    """Run VIA-SD, then plain SD (then AR), streaming each pane as its tokens are decided.

    Yields (via pane, sd pane, ar pane, metrics, status, traces state).
    """
    stop = stop_event(request)
    stop.clear()
    traces: dict = {}

    def out(message, kind="run", running=None):
        return (*panes(traces, running), metrics_html(traces), status_html(message, kind), traces)

    try:
        check_prompt(prompt)
        config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed)
        yield out(f"loading {preset} …" if preset not in _pairs else "starting …")
        pair = get_pair(preset, progress)
        apply_route(pair, preset, route)
        methods = ["via", "sd"] + (["ar"] if with_ar else [])
        for method in methods:
            shown = 0.0
            for trace in stream(pair, prompt, method, config, stop=stop):
                traces[method] = trace
                if time.perf_counter() - shown > 0.05:  # a fast pair would otherwise flood the page
                    shown = time.perf_counter()
                    yield out(f"{METHOD_TITLES[method]}: {len(trace.tokens)} tokens …", running=method)
            yield out(f"{METHOD_TITLES[method]} done", running=None)
            if stop.is_set():
                break
        if stop.is_set():
            yield out("Stopped. Partial traces are kept; plots and downloads show what ran.", "stop")
            return
        yield out("measuring fidelity (one full-model pass over each output) …")
        traces["fidelity"] = measure_fidelities(pair, traces)
        yield out(_done_message(traces), "ok")
    except ValueError as err:  # UserError, or the engine refusing an input (e.g. a prompt beyond the context)
        gr.Warning(str(err))
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
        gr.Warning(str(err))
        return pair_status(preset), status_html(str(err), "error")
    except Exception as err:
        log.exception("loading %s failed", preset)
        return pair_status(preset), status_html(f"Could not load {preset}: {type(err).__name__}: {err}", "error")
    return pair_status(preset), status_html(f"{preset} loaded", "ok")


def poll_status(preset):
    """The device line while a background load runs; the timer stops once the pair is there."""
    return pair_status(preset), gr.Timer(active=preset not in _pairs and _load_state["preset"] is not None)


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
            f'{t["signal"]} → estimated speed <b>{speed}</b> of the recorded run</div>'
            f'<table><tr><th></th><th>estimate</th><th>recorded</th></tr>{rows}</table>'
            f'<div class="via-card-note">{html.escape(est["label"])}</div><ul>{notes}</ul></div>')
    return card


def rerun_on_release(rerun, prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed,
                     route, with_ar, request: gr.Request = None, progress=gr.Progress()):
    """Slider released: run for real when "re-run on release" is ticked, else change nothing."""
    if not rerun:
        yield (gr.skip(),) * 6
        return
    yield from run_compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed,
                           route, with_ar, request=request, progress=progress)


def trace_table(traces: dict, method: str = "via"):
    """Trace tab: (table rows, JSON file, CSV file) of the chosen method's trace."""
    import pandas as pd

    trace = (traces or {}).get(method)
    columns = ["i", "text", "round", "tier", "outcome", "p_draft", "q_slim", "q_full", "confidence", "id"]
    if trace is None:
        return pd.DataFrame(columns=columns), None, None
    rows = [{c: round(t[c], 4) if isinstance(t.get(c), float) else t.get(c) for c in columns} for t in trace.tokens]
    folder = Path(tempfile.mkdtemp(prefix="via-sd-"))
    json_path, csv_path = folder / f"via-sd-trace-{method}.json", folder / f"via-sd-trace-{method}.csv"
    json_path.write_text(trace.to_json(indent=1), encoding="utf-8")
    csv_path.write_text(trace.to_csv(), encoding="utf-8")
    return pd.DataFrame(rows, columns=columns), str(json_path), str(csv_path)


def check_trace(trace: Trace) -> None:
    """Raises ValueError unless every view of the app can draw `trace` (an upload is untrusted)."""
    for t in trace.tokens:
        if not isinstance(t, dict) or t.get("tier") not in ("draft", "slim", "full") or \
                not isinstance(t.get("text"), str) or not isinstance(t.get("round"), int):
            raise ValueError("a token lacks its tier, text or round")
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
    traces = {}
    for f in files:
        path = Path(getattr(f, "name", f))
        if path.stat().st_size > MAX_UPLOAD_BYTES:
            raise UserError(f"{path.name} is larger than {MAX_UPLOAD_BYTES // 2**20} MB: not a trace this app reads.")
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text)
            items = data if isinstance(data, list) else [data]
            for item in items:
                trace = Trace.from_dict(item)
                if trace.method not in METHOD_TITLES:
                    raise ValueError(f"unknown method {trace.method!r}")
                check_trace(trace)
                traces[trace.method] = trace
        except UnicodeDecodeError:
            raise UserError(f"{path.name} is not a text file: upload a trace JSON saved by this app.") from None
        except json.JSONDecodeError as err:
            raise UserError(f"{path.name} is not JSON ({err.msg}, line {err.lineno}): upload a trace "
                            "saved by this app.") from None
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
        gr.Warning(str(err))
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
    did = verdict.get(decision, decision)
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
        return f"{name} {r_txt} ≥ accept {a:.2f}: tier A, accepted without any verifier."
    if tier == "slim":
        return f"{name} {r_txt} lies between escalate {e:.2f} and accept {a:.2f}: tier B, the slim verifier {did}."
    if first_full is not None and pos > first_full and isinstance(r, (int, float)) and r >= e:
        return (f"After draft #{first_full + 1} escalated, the full model checks every later draft too "
                f"({name.lower()} {r_txt}): it {did}.")
    return f"{name} {r_txt} < escalate {e:.2f}: tier C, deferred to the full model, which {did}."


def learn_view(traces: dict, k=1) -> str:
    """Round k (1-based, as on the slider) of the last VIA-SD trace (SD if none): what was drafted, each
    tier's decision and why."""
    trace = _learn_trace(traces)
    if trace is None:
        return ('<div class="via-learn" data-state="empty">Run once (or upload a trace) to step through its '
                'rounds.</div>')
    k = max(0, min(int(k or 1) - 1, len(trace.rounds) - 1))
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
        rows.append(f'<tr data-decision="{c.get("decision")}"><td>{c.get("pos", 0) + 1}</td><td>{chip}</td>'
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
    summary = (f"The drafter proposed {len(cands)} token(s) in {rnd.get('draft_ms', 0.0):.0f} ms. "
               f"{tiers.count('draft')} went to tier A (kept as drafted), {tiers.count('slim')} to tier B (slim "
               f"verifier, {rnd.get('slim_ms', 0.0):.0f} ms), {tiers.count('full')} to tier C (full model). "
               + (f"The full model ran ({full_ms:.0f} ms)." if rnd.get("full_called") else
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


def step_round(k, delta, traces: dict) -> int:
    """The learn slider's next value (1-based), clamped to the recorded rounds."""
    trace = _learn_trace(traces)
    last = len(trace.rounds) if trace else 1
    return max(1, min(int(k or 1) + int(delta), last))


# ---- threshold lab: a measured sweep --------------------------------------------------------------

def parse_grid(text: str, name: str) -> list[float]:
    try:
        values = sorted({round(float(v), 4) for v in str(text).replace(";", ",").split(",") if v.strip()})
    except ValueError:
        raise UserError(f"{name}: write numbers between 0 and 1 separated by commas, e.g. 0.3, 0.6, 0.9") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise UserError(f"{name}: write numbers between 0 and 1 separated by commas, e.g. 0.3, 0.6, 0.9")
    return values


@gpu
def measure_sweep(prompt, preset, gamma, signal, temperature, max_new_tokens, seed, route, accepts, escalates,
                  accept, escalate, theme="light", progress=gr.Progress()):
    """Run VIA-SD for real at every (accept, escalate) of the grid and plain SD on the same prompt
    (`via_sd.bench.run_sweep`, interleaved). Returns (frontier figure, status, sweep points).

    Speed-up is over plain SD, fidelity the full model's top-1 agreement with the output.
    """
    theme = theme if theme in viz.THEMES else "light"
    try:
        check_prompt(prompt)
        accept_values, escalate_values = parse_grid(accepts, "accept values"), parse_grid(escalates, "escalate values")
        grid = [(a, e) for a in accept_values for e in escalate_values if e <= a]
        if not grid:
            raise UserError("No (accept, escalate) pair in the grid has escalate ≤ accept.")
        if len(grid) > 24:
            raise UserError(f"The grid has {len(grid)} settings; keep it to 24 or fewer.")
        config = make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed)
        pair = get_pair(preset, progress)
        apply_route(pair, preset, route)
        result = run_sweep(pair, [{"task": "app", "prompt": prompt}], config, accept=accept_values,
                           escalate=escalate_values, signals=[config.thresholds.signal], repeats=1, warmup=1,
                           progress=lambda message, fraction: progress(fraction, desc=message))
        points = result["points"] + [{**result["sd"], "label": "plain SD"}]
        current = {"accept": float(accept), "escalate": float(escalate), "signal": config.thresholds.signal}
        figure = viz.frontier_figure(points, current=current, theme=theme, baseline="SD")
        best = result.get("best")
        tip = (f" Fastest with ≥95% agreement: accept {best['accept']:.2f}, escalate {best['escalate']:.2f} "
               f"({best['speedup']:.2f}× SD)." if best else " No setting reached 95% agreement.")
        return figure, status_html(f"Sweep done: {len(grid)} settings measured against plain SD "
                                   f"({result['sd']['tokens_per_s']:.1f} tokens/s) on this prompt.{tip}", "ok")
    except UserError as err:
        gr.Warning(str(err))
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
    with gr.Blocks(title="VIA-SD Studio", fill_width=True) as demo:
        traces = gr.State({})
        theme = gr.Textbox(value="light", visible="hidden", elem_id="theme")

        with gr.Sidebar(label="Settings", width=340, elem_id="settings"):
            gr.Markdown("### Settings")
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

        gr.Markdown(INTRO, elem_id="intro")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=4, max_lines=12, elem_id="prompt",
                                    placeholder="Ask something, or pick an example below")
                gr.Examples(examples, inputs=[prompt], example_labels=labels, label="Examples by task",
                            cache_examples=False, examples_per_page=10)
            with gr.Column(scale=2, min_width=300):
                model = gr.Dropdown(preset_choices(), value=preset, label="Model preset", elem_id="preset")
                device = gr.Markdown(pair_status(preset), elem_id="device")
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
                    next_round = gr.Button("Next ▶", elem_id="learn-next", scale=0)
                learn = gr.HTML(learn_view({}), elem_id="learn-view", js_on_load=None)

        # ---- events -------------------------------------------------------------------------------
        run_inputs = [prompt, model, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar]
        run_outputs = [via_pane, sd_pane, ar_pane, metrics, status, traces]
        view_outputs = [confidence_plot, tier_mix_plot, latency_plot, speedup_plot, position_plot, learn_round, learn]
        whatif_inputs = [traces, accept, escalate, signal, theme]
        light = dict(concurrency_limit=8, show_progress="hidden")

        def after_run(event):
            """Plots, trace tab and what-if follow every run and every upload."""
            return (event.then(views, [traces, theme], view_outputs, api_name=False, **light)
                    .then(trace_table, [traces, trace_method], [table, json_download, csv_download],
                          api_name=False, **light)
                    .then(what_if_view, whatif_inputs, [whatif, whatif_plot], api_name=False, **light))

        demo.load(None, None, theme, js=THEME_JS)
        timer = gr.Timer(1.0, active=_load_state["preset"] is not None or preset not in _pairs)
        timer.tick(poll_status, [model], [device, timer], api_name=False, show_progress="hidden")
        model.change(load_preset, [model], [device, status], api_name="load_preset", concurrency_id="gpu",
                     concurrency_limit=1)

        started = run.click(None, None, theme, js=THEME_JS).then(
            run_compare, run_inputs, run_outputs, api_name="run", concurrency_id="gpu", concurrency_limit=1)
        after_run(started)
        after_run(prompt.submit(None, None, theme, js=THEME_JS).then(
            run_compare, run_inputs, run_outputs, api_name=False, concurrency_id="gpu", concurrency_limit=1))
        stop.click(stop_run, None, status, api_name="stop", concurrency_limit=None, queue=False)
        with_ar.change(lambda on: gr.HTML(visible=bool(on)), [with_ar], [ar_pane], api_name=False, queue=False)
        presentation.change(None, [presentation], None, js=PRESENTATION_JS)

        card_inputs = [traces, accept, escalate, signal]
        for control in (accept, escalate, signal):
            # the card first (instant), then the slower re-drawn plot
            control.change(what_if_card, card_inputs, [whatif], api_name="what_if" if control is accept else False,
                           trigger_mode="always_last", **light).then(
                what_if_figure, whatif_inputs, [whatif_plot], api_name=False, trigger_mode="always_last", **light)
        for slider in (accept, escalate):
            after_run(slider.release(rerun_on_release, [rerun, *run_inputs], run_outputs, api_name=False,
                                     concurrency_id="gpu", concurrency_limit=1))

        sweep.click(None, None, theme, js=THEME_JS).then(
            measure_sweep, [prompt, model, gamma, signal, temperature, max_new_tokens, seed, route, sweep_accepts,
                            sweep_escalates, accept, escalate, theme], [frontier_plot, status],
            api_name="sweep", concurrency_id="gpu", concurrency_limit=1)

        trace_method.change(trace_table, [traces, trace_method], [table, json_download, csv_download],
                            api_name="trace_files", **light)
        after_run(upload.upload(replay_upload, [upload], run_outputs, api_name="replay", **light))

        learn_round.change(learn_view, [traces, learn_round], [learn], api_name="learn", **light)
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
    return demo.launch(css_paths=css_paths, theme=gr.themes.Soft(), **kwargs)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
           server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
