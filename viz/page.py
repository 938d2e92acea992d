"""The page's HTML pieces that frame the pictures: status line, output panes, legend, metric cards,
the model line and the race area's messages. Every value from a trace or a user is escaped here.

Plain inputs only (Traces, dicts, numbers, strings): no gradio, no model code.
"""

from __future__ import annotations

import html
from typing import Any

from .live import live_tokens_html
from .palette import TIER_COLORS
from .tokens import legend_html as _legend_chips
from .tokens import token_html

METHOD_TITLES = {"via": "VIA-SD", "sd": "Plain SD", "ar": "Autoregressive (AR)"}
SHORT = {"via": "VIA-SD", "sd": "SD", "ar": "AR"}
METHOD_ABOUT = {"via": "drafter → slim verifier → full model (three tiers, lossy)",
                "sd": "drafter → full model (two tiers, lossless)",
                "ar": "full model alone, one token per step"}
DRAFTER_WORDS = {"model": "the model drafter", "lookup": "prompt lookup", "hybrid": "hybrid (lookup, else the model)",
                 "early-exit": "early exit (the verifier's first layers)"}
ICONS = {"info": "ℹ", "ok": "✓", "error": "⚠", "run": "…", "stop": "■"}  # plain symbols: any font has them


def esc(x: Any) -> str:
    """Any value, as text safe inside HTML (also inside a quoted attribute)."""
    return html.escape(str(x), quote=True)


def fmt(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    return f"{x:{spec}}{suffix}" if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else "—"


def plural(n: Any, word: str, words: str | None = None) -> str:
    """"1 draft", "3 drafts", "— drafts" (a count not known)."""
    many = words or f"{word}s"
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n != n:
        return f"— {many}"
    return f"{n:g} {word if n == 1 else many}"


def ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b else None


def status_html(message: str, kind: str = "info") -> str:
    kind = kind if kind in ICONS else "info"
    return (f'<div class="via-status via-status-{kind}" role="status" data-kind="{kind}">'
            f'<span class="via-status-icon">{ICONS[kind]}</span> {esc(message)}</div>')


def pane_html(trace: Any, method: str, running: bool = False, live: tuple | None = None) -> str:
    """One output pane: a header with live counts and the tier-colored tokens (hover for details).

    `live`: (round, candidates) of the round being verified now: its drafts follow the tokens, pending
    until a tier decides them."""
    title = (f'<div class="via-pane-title"><b>{METHOD_TITLES[method]}</b> <span>{METHOD_ABOUT[method]}</span>'
             f'{drafter_tag(trace, method)}{route_tag(trace, method)}</div>')
    s = (getattr(trace, "summary", None) or {}) if trace is not None else {}
    if live is not None and running:
        counts = (f'<div class="via-pane-counts" data-state="running …">{esc(s.get("new_tokens", 0))} tokens · '
                  f'{fmt(s.get("tokens_per_s", 0.0), ".1f")} tokens/s · round {int(live[0]) + 1} being verified …'
                  '</div>')
        return title + counts + live_tokens_html(trace, live[1], live[0])
    if trace is None:
        hint = ("Press Run: VIA-SD runs first, then plain SD, then AR, one after another so their timings are "
                "comparable." if method == "via" else "Waits for the run before it.")
        return f'{title}<div class="via-pane-empty">{hint}</div>'
    state = "running …" if running else ("stopped" if s.get("stopped") else "done")
    counts = (f'<div class="via-pane-counts" data-state="{state}">{esc(s.get("new_tokens", 0))} tokens · '
              f'{fmt(s.get("tokens_per_s", 0.0), ".1f")} tokens/s · {len(trace.rounds)} rounds · {state}</div>')
    return title + counts + token_html(trace, legend=False)


# via_sd.NO_ROUTE, the words every face uses (viz imports no model code; tests/test_own_pair.py checks they agree)
NO_ROUTE = "no slim route yet: the slim verifier is the full model"


def route_tag(trace: Any, method: str) -> str:
    """The VIA-SD lane of a pair run without a slim route says so: its tier B was the full model."""
    if trace is None or method != "via" or (getattr(trace, "models", None) or {}).get("route") != "none":
        return ""
    return f' <span class="via-pane-route" data-route="none">{esc(NO_ROUTE)}</span>'


def drafter_tag(trace: Any, method: str) -> str:
    """Which drafter a speculative lane ran (an older trace without models.drafter_kind ran the model drafter)."""
    if trace is None or method == "ar":
        return ""
    kind = str((getattr(trace, "models", None) or {}).get("drafter_kind") or "model")
    return (f' <span class="via-pane-drafter" data-drafter="{esc(kind)}">drafts: '
            f'{esc(DRAFTER_WORDS.get(kind, kind))}</span>')


def legend_row_html() -> str:
    """One legend for every pane: what each token color means."""
    return ('<div class="via-legend-row"><span class="via-legend-lead">Who decided each token:</span>'
            + _legend_chips(labels=list(TIER_COLORS)) + "</div>")


def _card(key: str, title: str, value: str, subs=(), note: str = "") -> str:
    sub = "".join(f'<div class="via-card-sub">{a} {b}</div>' for a, b in subs)
    note = f'<div class="via-card-note">{note}</div>' if note else ""
    return (f'<div class="via-card" data-metric="{key}"><div class="via-card-title">{title}</div>'
            f'<div class="via-card-value">{value}</div>{sub}{note}</div>')


def metrics_html(traces: dict, fidelity: dict | None = None) -> str:
    """Metric cards: tokens/s, speed-ups vs AR and vs SD side by side, rejection rate, accepted length,
    full-model calls, fidelity (`fidelity`: {method: {agreement, mean_logprob}} or {"note": ...})."""
    via, sd, ar = (traces.get(m) for m in ("via", "sd", "ar"))
    if via is None and sd is None and ar is None:
        return '<div class="via-metrics-empty">Metrics appear after a run.</div>'
    tps = {m: (t.summary or {}).get("tokens_per_s") for m, t in (("via", via), ("sd", sd), ("ar", ar)) if t}
    fid = fidelity or {}

    def stat(t, key, spec=".2f"):
        return fmt((t.summary or {}).get(key), spec) if t else "—"

    main = via or sd or ar
    main_name = "VIA-SD" if via else METHOD_TITLES["sd" if sd else "ar"]
    main_tps = tps.get("via", tps.get("sd", tps.get("ar")))
    cards = [_card("tokens_per_s", f"tokens / s ({main_name})", fmt(main_tps, ".1f"),
                   [(SHORT[m], fmt(tps[m], ".1f")) for m in ("sd", "ar") if m in tps and via])]
    cards.append(_card("speedup_ar", "VIA-SD vs AR", fmt(ratio(tps.get("via"), tps.get("ar")), ".2f", "×"),
                       [("SD vs AR", fmt(ratio(tps.get("sd"), tps.get("ar")), ".2f", "×"))] if "ar" in tps else [],
                       "" if "ar" in tps else "tick “run AR too” to measure"))
    cards.append(_card("speedup_sd", "VIA-SD vs SD", fmt(ratio(tps.get("via"), tps.get("sd")), ".2f", "×"),
                       note="same prompt, one after the other"))
    cards.append(_card("rejection_rate", "rejection rate", stat(main, "rejection_rate"),
                       [("SD", stat(sd, "rejection_rate"))] if via and sd else []))
    cards.append(_card("mean_accepted_length", "mean accepted length", stat(main, "mean_accepted_length"),
                       [("SD", stat(sd, "mean_accepted_length"))] if via and sd else [], "tokens per round"))
    calls = (f'{esc((main.summary or {}).get("full_calls", 0))} <small>of {len(main.rounds)} rounds</small>'
             if main else "—")
    cards.append(_card("full_calls", "full-model calls", calls,
                       [("SD", esc((sd.summary or {}).get("full_calls", 0)))] if via and sd else []))
    via_fid = fid.get("via") or {}
    if via_fid:
        subs = [("SD", fmt((fid.get("sd") or {}).get("agreement"), ".1%"))] if fid.get("sd") else []
        if via_fid.get("mean_logprob") is not None:
            subs.append(("mean log-prob", fmt(via_fid.get("mean_logprob"), ".2f")))
        cards.append(_card("fidelity", "fidelity (full model agrees)", fmt(via_fid.get("agreement"), ".1%"), subs))
    else:
        cards.append(_card("fidelity", "fidelity", "—", note=esc(fid.get("note", "measured after the run"))))
    return f'<div class="via-metrics">{"".join(cards)}</div>'


def done_message(traces: dict) -> str:
    tps = {m: (t.summary or {}).get("tokens_per_s") for m, t in traces.items() if m in SHORT and t is not None}
    parts = [f"{fmt(ratio(tps.get('via'), tps.get(m)), '.2f', '×')} the speed of {SHORT[m]}"
             for m in ("sd", "ar") if m in tps and "via" in tps]
    return ("Done: VIA-SD ran at " + " and ".join(parts) + " on this prompt.") if parts else "Done."


# ---- the model line -----------------------------------------------------------------------------

def pair_line(device: str, dtype: str, weights: str, drafter: str, verifier: str, route: str, skipped: int,
              fraction: float, provisional: bool, kernel: str = "") -> str:
    """The loaded pair, as Markdown: device, dtype, weights and the kernel that runs them, models and route."""
    skips = f"skips {skipped} sub-layers ({fraction:.0%})" if skipped else "skips nothing"
    made = " — **provisional** (a rule, not searched): *search a better route* below" if provisional else ""
    runs = f" ({esc(kernel)})" if kernel else ""
    return (f"**{esc(device)}** · {esc(dtype)} · {esc(weights)} weights{runs} · {esc(drafter)} → {esc(verifier)} · "
            f"slim route `{esc(route)}` {skips}{made}")


def loading_html(preset: str, fraction: float, message: str) -> str:
    """The load's one line: a bar that only rises and the step it is on (`studio.loading`)."""
    return (f'<div class="via-load" data-state="loading"><progress value="{fraction:.3f}" max="1"></progress> '
            f'loading <b>{esc(preset)}</b> <span class="via-load-pct">{fraction:.0%}</span> · '
            f'<span class="via-load-step">{esc(message or "starting")}</span>'
            f'<br><small>the recorded run below works meanwhile; a Run waits for the models</small></div>')


def warning_line(message: str) -> str:
    return f"⚠ {esc(message)}"


def idle_line(device: str, about: str) -> str:
    return f"**{esc(device)}** · {esc(about)} · loads on first Run"


# ---- race area ----------------------------------------------------------------------------------

RACE_HINT = ('<div class="via-race" data-state="empty">After a run (or an upload of traces), '
             '<b>Replay as a race</b> plays VIA-SD, plain SD and AR side by side in the time they really took.</div>')


def race_ready_html(methods: list[str]) -> str:
    if not methods:
        return RACE_HINT
    names = " and ".join(METHOD_TITLES[m] for m in methods)
    return (f'<div class="via-race" data-state="ready">{esc(names)} recorded: press '
            f'<b>Replay as a race</b> to watch them side by side in their recorded time.</div>')
