"""Plotly figures of benchmark results: speed-up per method and the speed-up vs fidelity frontier
of a measured sweep. Same theme and palette as `viz.figures`."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import palette as P
from ._trace import as_trace, is_number, thresholds_dict
from .figstyle import _empty, new_figure, _style

def _bench_rows(results: Any) -> dict[str, dict]:
    """method -> {"tokens_per_s": mean, "std": spread or None, "n": runs}."""
    groups: dict[str, list[float]] = {}
    explicit: dict[str, dict] = {}

    def add_trace(method_key, t):
        t = as_trace(t)
        groups.setdefault(method_key or t.method, []).append(float(t.summary.get("tokens_per_s") or 0.0))

    if isinstance(results, dict):
        for method, value in results.items():
            if hasattr(value, "rounds"):
                add_trace(method, value)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    if hasattr(v, "rounds"):
                        add_trace(method, v)
                    else:
                        groups.setdefault(method, []).append(float(v["tokens_per_s"] if isinstance(v, dict) else v))
            elif isinstance(value, dict):
                explicit[method] = value
            else:
                groups.setdefault(method, []).append(float(value))
    else:
        for item in results:
            if isinstance(item, dict) and "method" in item and "tokens_per_s" in item:
                groups.setdefault(item["method"], []).append(float(item["tokens_per_s"]))
            else:
                add_trace(None, item)
    rows = {}
    for method, values in groups.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
        rows[method] = {"tokens_per_s": mean, "std": std, "n": len(values)}
    for method, value in explicit.items():
        runs = value.get("tokens_per_s_runs") or value.get("runs")
        if runs and all(is_number(v) for v in runs):
            mean = sum(runs) / len(runs)
            std = math.sqrt(sum((v - mean) ** 2 for v in runs) / (len(runs) - 1)) if len(runs) > 1 else None
            rows[method] = {"tokens_per_s": float(value.get("tokens_per_s", mean)), "std": std, "n": len(runs)}
        else:
            rows[method] = {"tokens_per_s": float(value["tokens_per_s"]),
                            "std": value.get("tokens_per_s_std", value.get("std")), "n": value.get("n")}
    return rows


def speedup_figure(results: Any, baseline: str | None = None, theme: str = "light") -> go.Figure:
    """Tokens/s (left) and speed-up over a baseline (right) for AR, SD, VIA-SD, HF assisted.

    `results` is any of
      * a dict method -> {"tokens_per_s": float, optional "tokens_per_s_std" or "tokens_per_s_runs"},
      * a dict method -> Trace or list of Traces (repeats; mean and spread are taken),
      * a list of Traces of one run (grouped by `trace.method`),
      * a list of dicts {"method": ..., "tokens_per_s": ...} (bench rows).
    `baseline`: the method speed-ups are relative to; default "ar" if present, else "sd", else the
    slowest method.
    """
    rows = _bench_rows(results)
    if not rows:
        return _empty("Speed", "no results", theme)
    known = ("ar", "sd", "via", "hf")
    order = [m for m in known if m in rows] + [m for m in rows if m not in known]
    if baseline is None:
        baseline = "ar" if "ar" in rows else "sd" if "sd" in rows else min(rows, key=lambda m: rows[m]["tokens_per_s"])
    if baseline not in rows:
        raise ValueError(f"baseline {baseline!r} is not among the results ({', '.join(rows)})")
    base = rows[baseline]["tokens_per_s"] or float("nan")
    names = [P.method_name(m) for m in order]
    colors = [P.METHOD_COLORS.get(m, P.OKABE_ITO["yellow"]) for m in order]
    tps = [rows[m]["tokens_per_s"] for m in order]
    std = [rows[m]["std"] or 0.0 for m in order]
    speed = [v / base for v in tps]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("throughput (tokens/s)", f"speed-up over {P.method_name(baseline)} (×)"))
    fig.add_trace(go.Bar(x=names, y=tps, marker_color=colors, showlegend=False, name="tokens/s",
                         error_y=dict(type="data", array=std, visible=any(std), thickness=2),
                         text=[f"{v:,.1f}" for v in tps], textposition="outside", cliponaxis=False,
                         hovertemplate="%{x}: %{y:.2f} tokens/s<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=speed, marker_color=colors, showlegend=False, name="speed-up",
                         text=[f"{v:.2f}×" for v in speed], textposition="outside", cliponaxis=False,
                         hovertemplate=f"%{{x}}: %{{y:.2f}}× {P.method_name(baseline)}<extra></extra>"), row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color=P.neutral_color(theme), dash="dash", width=1.5), row=1, col=2)
    _style(fig, theme, "Decoding speed", "mean over runs; error bars: standard deviation across repeats" if any(std)
           else "tokens per second of decoding (prefill excluded)", height=520)
    for ann in fig.layout.annotations[:2]:  # the two subplot titles
        ann.font.size = 18
    fig.update_layout(margin=dict(t=fig.layout.margin.t + 40))  # room for the subplot titles
    fig.update_yaxes(title_text="tokens / s", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="speed-up (×)", row=1, col=2, rangemode="tozero")
    top_t = max(t + s for t, s in zip(tps, std)) if tps else 1
    fig.update_yaxes(range=[0, top_t * 1.18], row=1, col=1)
    fig.update_yaxes(range=[0, max(speed + [1.0]) * 1.18], row=1, col=2)
    fig.update_xaxes(title_text="method")
    return fig


# ---- tier mix ------------------------------------------------------------------------------------

def _pareto(points: list[dict]) -> list[dict]:
    """Points no other point beats on both fidelity and speed-up, by fidelity."""
    best, out = -math.inf, []
    for p in sorted(points, key=lambda p: (-p["fidelity"], -p["speedup"])):
        if p["speedup"] > best:
            out.append(p)
            best = p["speedup"]
    return sorted(out, key=lambda p: p["fidelity"])


def _signal_points(fig: go.Figure, tuned: list[dict], theme: str) -> None:
    """Per signal: its settings as markers and, through its Pareto-best ones, a dashed line."""
    symbols = {"slim": "circle", "draft": "diamond"}
    for signal in sorted({p.get("signal", "slim") for p in tuned}, key=lambda s: (s != "slim", s)):
        group = [p for p in tuned if p.get("signal", "slim") == signal]
        color = P.SIGNAL_COLORS.get(signal, P.OKABE_ITO["orange"])
        front = _pareto(group)
        if len(front) > 1:
            fig.add_trace(go.Scatter(x=[p["fidelity"] for p in front], y=[p["speedup"] for p in front],
                                     mode="lines", line=dict(color=color, width=2, dash="dash"),
                                     name=f"best trade-offs ({signal})", hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=[p["fidelity"] for p in group], y=[p["speedup"] for p in group], mode="markers",
            name=f"signal: {signal}", marker=dict(color=color, size=13, symbol=symbols.get(signal, "square"),
                                                  line=dict(width=1, color=P.neutral_color(theme))),
            customdata=[[p["accept"], p["escalate"], p.get("tokens_per_s", float("nan"))] for p in group],
            hovertemplate=("accept %{customdata[0]:.2f} · escalate %{customdata[1]:.2f}<br>speed-up %{y:.2f}×"
                           " · fidelity %{x:.1%}<extra>signal: " + signal + "</extra>"),
        ))


def _reference_points(fig: go.Figure, refs: list[dict]) -> None:
    """Entries without thresholds (plain SD, say): a labelled star each."""
    for p in refs:
        label = str(p.get("label") or P.method_name(p.get("method", "reference")))
        fig.add_trace(go.Scatter(x=[p["fidelity"]], y=[p["speedup"]], mode="markers+text", name=label,
                                 text=[label], textposition="top center",
                                 marker=dict(color=P.METHOD_COLORS.get(p.get("method"), P.OKABE_ITO["grey"]),
                                             size=15, symbol="star"),
                                 hovertemplate=f"{label}: %{{y:.2f}}× · fidelity %{{x:.1%}}<extra></extra>"))


def _current_ring(fig: go.Figure, current: Any, tuned: list[dict]) -> list[str]:
    """Rings the current thresholds' point; returns a note when the sweep does not have them."""
    cur = current if isinstance(current, dict) else {}
    th = thresholds_dict(current) if (cur.get("accept") is not None or not isinstance(current, dict)) else None
    if is_number(cur.get("speedup")) and is_number(cur.get("fidelity")):
        marks = [cur]
    elif th:
        marks = [p for p in tuned if abs(p["accept"] - th["accept"]) < 1e-6
                 and abs(p["escalate"] - th["escalate"]) < 1e-6 and p.get("signal", "slim") == th["signal"]]
    else:
        marks = []
    if marks:
        fig.add_trace(go.Scatter(x=[m["fidelity"] for m in marks], y=[m["speedup"] for m in marks],
                                 mode="markers", name="current thresholds",
                                 marker=dict(size=26, symbol="circle-open", color=P.OKABE_ITO["vermillion"],
                                             line=dict(width=3.5)),
                                 hovertemplate="current thresholds<extra></extra>"))
    elif th:
        return [f"current thresholds (accept {th['accept']:.2f}, escalate {th['escalate']:.2f}, "
                f"{th['signal']}) are not in the sweep"]
    return []


def frontier_figure(sweep: list[dict], current: Any = None, theme: str = "light",
                    baseline: str = "AR") -> go.Figure:
    """Speed-up (y) against fidelity (x) over a threshold sweep, one color and symbol per signal.

    `sweep`: dicts {accept, escalate, signal, speedup, fidelity, ...}; fidelity in [0, 1] (share of
    tokens the full model agrees with). Entries without thresholds but with a "method" or "label"
    (e.g. plain SD at fidelity 1) are drawn as reference points. The dashed line per signal joins
    its Pareto-best settings. `current`: the thresholds in use (Thresholds or dict, optionally with
    its own speedup / fidelity), ringed.
    """
    points = [p for p in sweep if is_number(p.get("speedup")) and is_number(p.get("fidelity"))]
    if not points:
        return _empty("Speed-up vs fidelity", "no sweep results yet", theme)
    fig = new_figure()
    tuned = [p for p in points if p.get("accept") is not None and p.get("escalate") is not None]
    _signal_points(fig, tuned, theme)
    _reference_points(fig, [p for p in points if p not in tuned])
    notes = _current_ring(fig, current, tuned) if current is not None else []
    fig.add_hline(y=1.0, line=dict(color=P.neutral_color(theme), dash="dot", width=1.5),
                  annotation=dict(text=f"as fast as {baseline}", font=dict(size=14, color=P.neutral_color(theme))),
                  annotation_position="bottom right")
    _style(fig, theme, "Speed-up vs fidelity over a threshold sweep",
           "up = faster; right = closer to the full model (VIA-SD is lossy, plain SD is not)", height=560,
           notes=notes)
    xs = [p["fidelity"] for p in points]
    lo = min(xs)
    pad = max(0.02, (max(xs) - lo) * 0.08)
    fig.update_xaxes(title_text="fidelity: tokens the full model agrees with (%)", tickformat=".0%",
                     range=[max(0.0, lo - pad), 1.0 + pad / 2])
    fig.update_yaxes(title_text=f"speed-up over {baseline} (×)",
                     range=[0, max([p["speedup"] for p in points] + [1.0]) * 1.15])
    return fig
