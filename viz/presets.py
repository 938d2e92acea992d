"""Where the named threshold presets would land on a recorded VIA-SD trace -- an ESTIMATE.

`preset_points_figure(trace, presets, current)` re-tiers the trace's recorded drafts under each
preset with `viz.what_if` and draws one point per preset: x = the share of emitted tokens the full
model decided (tier C; 100% is plain SD, lossless), y = the estimated speed against the recorded
run. The slider setting is drawn as a ring. Presets are plain dicts {accept, escalate, signal}
(the app passes `via_sd.THRESHOLD_PRESETS`), so viz needs no engine import.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import palette as P
from ._trace import as_trace, is_number, thresholds_dict
from .figstyle import _empty, new_figure, _style
from .what_if import ESTIMATE_LABEL, what_if

PRESET_COLORS = {"paper": P.OKABE_ITO["sky_blue"], "fastest": P.OKABE_ITO["bluish_green"],
                 "lossless": P.OKABE_ITO["blue"]}


def preset_point(trace: Any, thresholds: Any) -> dict:
    """{full_share, speedup, tokens, thresholds} of one setting on a VIA-SD trace (estimate)."""
    est = what_if(trace, thresholds)
    tokens = est["new_tokens"] or 1
    return {"full_share": est["tier_counts"]["full"] / tokens, "speedup": est["speedup_vs_recorded"],
            "tokens": est["new_tokens"], "thresholds": est["thresholds"], "tier_counts": est["tier_counts"]}


def preset_points_figure(trace: Any, presets: dict, current: Any = None, theme: str = "light") -> go.Figure:
    """One point per named preset (and a ring for `current`) on a recorded VIA-SD trace."""
    title = "Threshold presets on this run — ESTIMATE"
    if trace is None:
        return _empty(title, "run once (or upload a VIA-SD trace) to place the presets", theme)
    trace = as_trace(trace)
    if trace.method != "via" or not trace.rounds:
        return _empty(title, "the presets re-tier a VIA-SD trace", theme)
    fig = new_figure()
    points = []
    for name, th in presets.items():
        point = preset_point(trace, thresholds_dict(th))
        if not is_number(point["speedup"]):
            continue
        points.append(point)
        t = point["thresholds"]
        fig.add_trace(go.Scatter(
            x=[point["full_share"]], y=[point["speedup"]], mode="markers+text", name=name, text=[name],
            textposition="top center", textfont=dict(size=16),
            marker=dict(size=18, color=PRESET_COLORS.get(name, P.OKABE_ITO["orange"]), symbol="diamond",
                        line=dict(width=1, color=P.neutral_color(theme))),
            hovertemplate=(f"<b>{name}</b>: accept {t['accept']:.2f} · escalate {t['escalate']:.2f} · "
                           f"{t['signal']}<br>estimated %{{y:.2f}}× the recorded speed<br>"
                           "tokens decided by the full model %{x:.0%}<extra></extra>")))
    if current is not None:
        th = thresholds_dict(current)
        point = preset_point(trace, th)
        if is_number(point["speedup"]):
            points.append(point)
            fig.add_trace(go.Scatter(
                x=[point["full_share"]], y=[point["speedup"]], mode="markers", name="sliders",
                marker=dict(size=28, symbol="circle-open", color=P.OKABE_ITO["vermillion"], line=dict(width=3.5)),
                hovertemplate=(f"sliders: accept {th['accept']:.2f} · escalate {th['escalate']:.2f} · "
                               f"{th['signal']}<br>estimated %{{y:.2f}}×<extra></extra>")))
    if not points:
        return _empty(title, "no estimate possible for this trace", theme)
    fig.add_hline(y=1.0, line=dict(color=P.neutral_color(theme), dash="dot", width=1.5),
                  annotation=dict(text="as fast as the recorded run", font=dict(size=14, color=P.neutral_color(theme))),
                  annotation_position="bottom right")
    _style(fig, theme, title, "up = faster than the recorded run; right = more tokens checked by the full model "
           "(100% = plain SD, lossless)", height=440, notes=[ESTIMATE_LABEL],
           legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, font=dict(size=15)))
    fig.update_xaxes(title_text="tokens decided by the full model", tickformat=".0%", range=[-0.05, 1.08])
    fig.update_yaxes(title_text="estimated speed (× recorded)",
                     range=[0, max(p["speedup"] for p in points) * 1.25 + 0.05])
    return fig
