"""Replay recorded traces as a race: side by side, in their real recorded time.

Each trace becomes a lane. Its rounds follow each other on a shared clock (the prompt's prefill
first, then each round's drafter, slim verifier, full model and bookkeeping time, as recorded);
a round's tokens appear when the round ends. `race_html(traces, t_ms)` is the frame at replay
time `t_ms` (recorded milliseconds since the request); `race_end_ms(traces)` the time the last
lane finishes. The app plays frames from a generator; nothing here runs a model.

Stable hooks for scripts and tests: the root has `data-state="playing" | "done"` and
`data-t-ms`; each lane `data-method`, `data-tokens` (shown so far), `data-total` (recorded) and
`data-state="running" | "finished"`, and when finished `data-place` (1 = first).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from . import palette as P
from ._trace import as_traces, is_number
from .tokens import _chip, token_label, visible_text

PHASES = ("draft", "slim", "full", "other")
TEXT_TAIL = 160  # tokens shown per lane (the latest ones)


@dataclass
class Lane:
    method: str
    name: str
    start_ms: float  # when round 0 starts (after a separate prefill, if one was recorded)
    segments: list = field(default_factory=list)  # (t0, t1, phase, round)
    token_times: list = field(default_factory=list)  # emission time of each token, in order
    tokens: list = field(default_factory=list)
    end_ms: float = 0.0


def _ms(x: Any) -> float:
    return float(x) if is_number(x) and x > 0 else 0.0


def lane_of(trace: Any) -> Lane:
    """A trace's replay schedule: phase segments and token emission times on its own clock."""
    prefill = _ms((trace.summary or {}).get("prefill_ms"))
    lane = Lane(trace.method, P.method_name(trace.method), prefill, tokens=list(trace.tokens))
    per_round: dict = {}
    for tok in trace.tokens:
        per_round[tok.get("round")] = per_round.get(tok.get("round"), 0) + 1
    t = prefill
    for rnd in trace.rounds:
        for phase in PHASES:
            ms = _ms(rnd.get(f"{phase}_ms"))
            if ms:
                lane.segments.append((t, t + ms, phase, rnd.get("round")))
                t += ms
        lane.token_times.extend([t] * per_round.get(rnd.get("round"), 0))
    lane.token_times.extend([t] * (len(lane.tokens) - len(lane.token_times)))  # tokens of no recorded round
    lane.end_ms = t
    return lane


def lanes_of(traces: Any) -> list[Lane]:
    if isinstance(traces, dict):
        traces = [traces[m] for m in ("via", "sd", "ar", "hf") if traces.get(m) is not None]
    return [lane_of(t) for t in as_traces(traces)]


def race_end_ms(traces: Any) -> float:
    """When the slowest lane finishes (recorded ms)."""
    return max((lane.end_ms for lane in lanes_of(traces)), default=0.0)


def _secs(ms: float) -> str:
    return f"{ms / 1000:.2f} s"


def _lane_html(lane: Lane, t: float, scale: float, place: int | None) -> str:
    shown = sum(1 for x in lane.token_times if x <= t)
    finished = t >= lane.end_ms
    spent = dict.fromkeys(PHASES, 0.0)
    segs = []
    for t0, t1, phase, rnd in lane.segments:
        if t0 >= t:
            break
        t1 = min(t1, t)
        spent[phase] += t1 - t0
        left, width = 100 * t0 / scale, max(100 * (t1 - t0) / scale, 0.15)
        segs.append(f'<div class="via-race-seg" data-phase="{phase}" title="round {html.escape(str(rnd))} · '
                    f'{P.PHASE_NAMES[phase]} {t1 - t0:.1f} ms" style="position:absolute;top:0;bottom:0;'
                    f'left:{left:.3f}%;width:{width:.3f}%;background:{P.PHASE_COLORS[phase]}"></div>')
    now = min(t, lane.end_ms)
    marker = (f'<div class="via-race-finish" style="position:absolute;top:-4px;bottom:-4px;left:{100 * now / scale:.3f}%;'
              f'border-left:3px solid currentColor"></div>')
    elapsed = min(t, lane.end_ms)
    tps = shown / (elapsed / 1000) if elapsed > 0 else 0.0
    if finished:
        badge = (f'<span class="via-race-badge" data-place="{place}">{"finished first" if place == 1 else "finished"}'
                 f' · {_secs(lane.end_ms)}</span>')
    else:
        badge = '<span class="via-race-badge via-race-running">running …</span>'
    split = " · ".join(f'<span style="border-bottom:3px solid {P.PHASE_COLORS[p]}">{P.PHASE_NAMES[p].split(" (")[0]} '
                       f'{_secs(spent[p])}</span>' for p in PHASES if spent[p] >= 0.005)
    tail = lane.tokens[max(0, shown - TEXT_TAIL):shown]
    chips = "".join(_chip(visible_text(str(tok.get("text", ""))), P.TIER_COLORS[token_label(tok, lane.method)])
                    for tok in tail)
    more = "… " if shown > TEXT_TAIL else ""
    attrs = (f'data-method="{html.escape(lane.method, quote=True)}" data-tokens="{shown}" '
             f'data-total="{len(lane.tokens)}" data-state="{"finished" if finished else "running"}"'
             + (f' data-place="{place}"' if finished and place else ""))
    return (f'<div class="via-race-lane" {attrs}>'
            f'<div class="via-race-head"><b>{html.escape(lane.name)}</b> {badge}</div>'
            f'<div class="via-race-count"><b>{shown}</b> / {len(lane.tokens)} tokens · {_secs(elapsed)} · '
            f'{tps:.1f} tokens/s</div>'
            f'<div class="via-race-track" style="position:relative;height:26px;border-radius:4px;'
            f'background:rgba(127,127,127,0.15);margin:6px 0">{"".join(segs)}{marker}</div>'
            f'<div class="via-race-split">{split}</div>'
            f'<div class="via-race-text">{more}{chips}</div></div>')


def race_html(traces: Any, t_ms: float, speed: float = 1.0) -> str:
    """The race frame at replay time `t_ms` (clamped to the end: the final frame shows every token)."""
    lanes = lanes_of(traces)
    if not lanes:
        return '<div class="via-race" data-state="empty">Nothing to replay: run once, or upload traces.</div>'
    end = max(lane.end_ms for lane in lanes)
    t = max(0.0, min(float(t_ms), end))
    scale = end or 1.0
    order = sorted((lane.end_ms, k) for k, lane in enumerate(lanes))
    places = {k: n for n, (_, k) in enumerate(order, start=1)}
    done = t >= end
    state = "done" if done else "playing"
    lanes_html = "".join(_lane_html(lane, t, scale, places[k]) for k, lane in enumerate(lanes))
    if done and len(lanes) > 1:
        first, second = lanes[order[0][1]], lanes[order[1][1]]
        ratio = second.end_ms / first.end_ms if first.end_ms else float("nan")
        verdict = (f'<b>{html.escape(first.name)}</b> finished first, {ratio:.2f}× as fast as '
                   f'{html.escape(second.name)} on this prompt (recorded time).')
    else:
        verdict = f'replaying at {speed:g}× recorded speed'
    legend = " ".join(f'<span class="via-race-key"><i style="background:{P.PHASE_COLORS[p]}"></i>'
                      f'{P.PHASE_NAMES[p]}</span>' for p in PHASES)
    return (f'<div class="via-race" data-state="{state}" data-t-ms="{t:.1f}" data-end-ms="{end:.1f}">'
            f'<div class="via-race-clock"><b>{_secs(t)}</b> of {_secs(end)} · {verdict}</div>'
            f'<div class="via-race-lanes">{lanes_html}</div>'
            f'<div class="via-race-legend">time on the track: {legend}</div></div>')
