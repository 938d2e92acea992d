"""Plotly figures of VIA-SD traces: confidence vs thresholds, latency per round, tier mix, acceptance
by draft position. Benchmark figures (speed-up, frontier) are in `viz.bench_figures`.

Every figure takes `theme="light" | "dark"` (plotly_white / plotly_dark) and uses the one
palette of `viz.palette`, so a tier has the same color here as in the colored tokens.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import palette as P
from ._trace import KEPT_DECISIONS, as_trace, as_traces, fmt_prob, is_number, thresholds_dict, trace_thresholds
from .figstyle import _empty, new_figure, _esc, _hover_text, _style, trace_names
from .tokens import TIER_LETTER, candidate_label, token_label
from .what_if import ESTIMATE_LABEL, what_if

CANDIDATE_ORDER = [P.ACCEPTED_DRAFT, P.SLIM_KEPT, P.SLIM_REGENERATED, P.FULL_KEPT, P.FULL_CORRECTED, P.DISCARDED]
TOKEN_ORDER = [P.ACCEPTED_DRAFT, P.SLIM_KEPT, P.SLIM_REGENERATED, P.FULL_KEPT, P.FULL_CORRECTED, P.BONUS,
               P.AUTOREGRESSIVE]
MARKERS = {P.SLIM_REGENERATED: "x", P.FULL_CORRECTED: "x", P.DISCARDED: "circle-open"}
SIGNAL_TEXT = {"slim": "r = q′(x) / max q′ (slim verifier)", "draft": "r = p(x), the drafter's probability"}

# ---- confidence vs thresholds --------------------------------------------------------------------

def _retiered(trace, thresholds: Any) -> tuple[list[dict], dict | None, dict | None]:
    """(candidates, thresholds, estimate): re-tiered by `viz.what_if` when other thresholds are asked for."""
    cands = trace.candidates()
    th = trace_thresholds(trace)
    if thresholds is None or th is None:
        return cands, th, None
    new = thresholds_dict(thresholds if not isinstance(thresholds, dict) or "signal" in thresholds
                          else {**thresholds, "signal": th["signal"]})
    if new == th:
        return cands, th, None
    estimate = what_if(trace, new)
    cands = [dict(c, **{k: e[k] for k in ("tier", "decision", "confidence")})
             for c, e in zip(cands, estimate["candidates"])]
    return cands, estimate["thresholds"], estimate


def _tier_bands(fig: go.Figure, th: dict, theme: str) -> None:
    """The three tier bands, shaded and named, and the accept / escalate thresholds as dashed lines."""
    op = P.band_opacity(theme)
    for tier, y0, y1 in (("draft", th["accept"], 1.0), ("slim", th["escalate"], th["accept"]),
                         ("full", 0.0, th["escalate"])):
        if y1 > y0:
            fig.add_hrect(y0=y0, y1=y1, fillcolor=P.COLOR_BY_TIER[tier], opacity=op, line_width=0, layer="below")
            fig.add_annotation(text=P.TIER_NAMES[tier].replace(": ", "<br>"), xref="paper", yref="y", x=1.01,
                               y=(y0 + y1) / 2, xanchor="left", yanchor="middle", showarrow=False, align="left",
                               font=dict(size=14, color=P.neutral_color(theme)))
    same = th["accept"] == th["escalate"]  # one line, one label: no tier B band
    for key in ("accept",) if same else ("accept", "escalate"):
        label = f"accept = escalate = {th[key]:.2f}" if same else f"{key} = {th[key]:.2f}"
        fig.add_hline(y=th[key], line=dict(color=P.neutral_color(theme), width=2, dash="dash"),
                      annotation=dict(text=label, xanchor="left", x=0.005,
                                      font=dict(size=15, color=P.neutral_color(theme))),
                      annotation_position="top left", name=f"{key} threshold")


def _candidate_points(label: str, group: list[dict], xs: dict, y_key: str, theme: str) -> go.Scatter:
    """One legend entry: the candidates of one label, with every recorded number on hover."""
    return go.Scatter(
        x=[xs[id(c)] for c in group], y=[c.get(y_key) for c in group], mode="markers", name=label,
        marker=dict(color=P.CANDIDATE_COLORS[label], size=12 if label != P.DISCARDED else 10,
                    symbol=MARKERS.get(label, "circle"),
                    line=dict(width=2.5 if label in MARKERS else 0.8,
                              color=P.CANDIDATE_COLORS[label] if label in MARKERS else P.neutral_color(theme))),
        customdata=[[_hover_text(c.get("text", "")), _esc(c.get("round")), _esc(c.get("pos", 0) + 1),
                     fmt_prob(c.get("p_draft")), fmt_prob(c.get("q_slim")), fmt_prob(c.get("q_full")),
                     fmt_prob(c.get("confidence")), _esc(f"{TIER_LETTER.get(c.get('tier'), '?')} ({c.get('tier')})"),
                     _esc(c.get("decision"))] for c in group],
        hovertemplate=("<b>%{customdata[0]}</b><br>round %{customdata[1]}, draft %{customdata[2]}"
                       "<br>tier %{customdata[7]}: %{customdata[8]}<br>p_draft %{customdata[3]} · q_slim "
                       "%{customdata[4]} · q_full %{customdata[5]}<br>confidence r %{customdata[6]}"
                       f"<extra>{label}</extra>"),
    )


def _add_candidates(fig: go.Figure, cands: list[dict], y_key: str, theme: str) -> int:
    """The candidates in drafting order, one trace per label; returns how many had no y to draw."""
    xs = {id(c): n for n, c in enumerate(cands, start=1)}
    missing = 0
    by_label: dict[str, list] = {lab: [] for lab in CANDIDATE_ORDER}
    for c in cands:
        if not is_number(c.get(y_key)):
            missing += 1
            continue
        by_label.setdefault(candidate_label(c), []).append(c)
    for label, group in by_label.items():
        if group:
            fig.add_trace(_candidate_points(label, group, xs, y_key, theme))
    return missing


def confidence_figure(trace: Any, thresholds: Any = None, theme: str = "light") -> go.Figure:
    """Every drafted candidate (discarded ones too) in drafting order against the thresholds.

    x: draft number across the whole run (1, 2, ...); y: the confidence r that sorted it into a
    tier, with the accept / escalate thresholds as lines and the three tier bands shaded; color and
    symbol: what happened to it (one legend entry per label). Plain SD traces have no thresholds:
    y is the drafter's probability p(x) and color the full model's decision.
    `thresholds` (VIA-SD only): re-tier the recorded drafts under other thresholds with
    `viz.what_if`; the figure then says it shows an estimate.
    """
    trace = as_trace(trace)
    name = P.method_name(trace.method)
    if trace.method == "ar":
        return _empty(f"Draft confidence — {name}",
                      "Autoregressive decoding drafts nothing: every token comes from the full model.", theme)
    cands, th, estimate = _retiered(trace, thresholds)
    if th is not None:
        ylabel, y_key = f"confidence {SIGNAL_TEXT.get(th['signal'], 'r')}", "confidence"
        title = f"Draft confidence vs thresholds — {name}"
        subtitle = (f"signal: {th['signal']} · accept ≥ {th['accept']:.2f} → tier A · escalate < "
                    f"{th['escalate']:.2f} → tier C · gamma = {_esc(trace.config.get('gamma', '?'))}")
    else:
        ylabel, y_key = "drafter probability p(x)", "p_draft"
        title = f"Draft probabilities — {name}"
        subtitle = "plain SD has no thresholds: the full model checks every draft; y is the drafter's p(x)"
    notes = []
    if estimate is not None:
        title = f"What if: {title} — ESTIMATE"
        notes.append(f"{ESTIMATE_LABEL}: {estimate['guessed_decisions']} decision(s) guessed, "
                     f"{estimate['changed_rounds']} of {estimate['rounds']} rounds end differently")
    fig = new_figure()
    if th is not None:
        _tier_bands(fig, th, theme)
    missing = _add_candidates(fig, cands, y_key, theme)
    if missing:
        notes.append(f"{missing} draft(s) without a recorded {'confidence' if th else 'p(x)'} are not shown")
    _style(fig, theme, title, subtitle, height=600, notes=notes,
           legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, font=dict(size=15)))
    fig.update_layout(margin=dict(r=150 if th is not None else 30))
    fig.update_yaxes(title_text=ylabel, range=[-0.03, 1.05], dtick=0.2)
    fig.update_xaxes(title_text="draft number, in drafting order (hover a point for its round)", rangemode="tozero")
    return fig


# ---- latency timeline ----------------------------------------------------------------------------

def _round_segments(bars: dict, trace, name: str) -> float:
    """Adds one trace's prefill and per-phase segments to `bars`; returns when its last round ends (ms)."""
    prefill = float((trace.summary or {}).get("prefill_ms") or 0.0)
    if prefill > 0:
        b = bars["prefill"]
        b["x"].append(prefill), b["y"].append(name), b["base"].append(0.0), b["custom"].append(["prompt", 0, ""])
    end = prefill
    per_round: dict = {}
    for tok in trace.tokens:
        per_round[tok.get("round")] = per_round.get(tok.get("round"), 0) + 1
    for rnd in trace.rounds:
        t = float(rnd.get("start_ms") or 0.0)
        emitted = per_round.get(rnd.get("round"), 0)
        for phase in ("draft", "slim", "full", "other"):
            ms = float(rnd.get(f"{phase}_ms") or 0.0)
            if ms <= 0:
                continue
            b = bars[phase]
            b["x"].append(ms), b["y"].append(name), b["base"].append(t)
            b["custom"].append([rnd.get("round"), emitted, f"{t:.1f}"])
            t += ms
        end = max(end, t)
    return end


def _phase_bar(phase: str, b: dict, sep: str) -> go.Bar:
    """Every segment of one phase, across the traces, as one legend entry."""
    phase_names = {"prefill": "prefill (prompt)", **P.PHASE_NAMES}
    color = P.OKABE_ITO["grey"] if phase == "prefill" else P.PHASE_COLORS[phase]
    return go.Bar(
        x=b["x"], y=b["y"], base=b["base"], orientation="h", name=phase_names[phase],
        marker=dict(color=color, line=dict(color=sep, width=0.6),
                    pattern=dict(shape="/", fgcolor=sep) if phase == "prefill" else None),
        customdata=b["custom"],
        hovertemplate=(f"<b>{phase_names[phase]}</b> %{{x:.1f}} ms<br>round %{{customdata[0]}} · "
                       "starts at %{customdata[2]} ms<br>tokens emitted in this round: %{customdata[1]}"
                       "<extra>%{y}</extra>") if phase != "prefill" else
                      "<b>prefill</b> %{x:.1f} ms<extra>%{y}</extra>",
    )


def latency_figure(traces: Any, theme: str = "light") -> go.Figure:
    """Per-round timeline: one row per trace (e.g. VIA-SD above SD above AR) on a shared time axis in ms.

    Each round is drawn as consecutive segments: drafter, slim verifier, full model, other
    (bookkeeping), starting at the round's `start_ms`; the prompt's prefill is the first segment.
    Two-tier SD pays the full model every round; VIA-SD only in the rounds that escalate.
    """
    traces = as_traces(traces)
    if not traces:
        return _empty("Latency per round", "no traces", theme)
    names = trace_names(traces)
    sep = "#111111" if theme == "dark" else "#FFFFFF"
    bars = {k: {"x": [], "y": [], "base": [], "custom": []} for k in ("prefill", "draft", "slim", "full", "other")}
    ends = [(name, _round_segments(bars, trace, name), len(trace.tokens)) for trace, name in zip(traces, names)]
    fig = new_figure()
    for phase, b in bars.items():
        if b["x"]:
            fig.add_trace(_phase_bar(phase, b, sep))
    longest = max(e for _, e, _ in ends) or 1.0
    for name, end, n in ends:
        fig.add_annotation(x=end, y=name, text=f" {n} tokens in {end:,.0f} ms", xanchor="left", showarrow=False,
                           font=dict(size=15, color=P.neutral_color(theme)))
    _style(fig, theme, "Where the time goes, round by round",
           "drafter, slim verifier and full model time per round; the full model runs only in rounds that need it",
           height=max(330, 150 + 95 * len(traces)),
           legend=dict(orientation="h", yanchor="top", y=-0.3 if len(traces) < 3 else -0.22, x=0, font=dict(size=15)))
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_xaxes(title_text="time since the request (ms)", range=[0, longest * 1.2])
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(names)), title_text="")
    return fig


# ---- speed-up ------------------------------------------------------------------------------------

def tier_mix_figure(traces: Any, theme: str = "light") -> go.Figure:
    """Share of emitted tokens per label (tier and outcome), one 100% bar per trace."""
    traces = as_traces(traces)
    if not traces:
        return _empty("Who produced each token", "no traces", theme)
    names = trace_names(traces)
    counts = []
    for trace in traces:
        c: dict[str, int] = {}
        for tok in trace.tokens:
            lab = token_label(tok, trace.method)
            c[lab] = c.get(lab, 0) + 1
        counts.append(c)
    fig = new_figure()
    for label in TOKEN_ORDER:
        ns = [c.get(label, 0) for c in counts]
        if not any(ns):
            continue
        totals = [max(len(t.tokens), 1) for t in traces]
        share = [100.0 * n / tot for n, tot in zip(ns, totals)]
        fig.add_trace(go.Bar(
            x=share, y=names, orientation="h", name=label, marker_color=P.TIER_COLORS[label],
            marker_line=dict(width=0.8, color="#111111" if theme == "dark" else "#FFFFFF"),
            text=[f"{s:.0f}%" if s >= 6 else "" for s in share], textposition="inside", insidetextanchor="middle",
            textfont=dict(color=P.text_color(P.TIER_COLORS[label]), size=16),
            customdata=list(zip(ns, totals)),
            hovertemplate=f"<b>{label}</b><br>%{{customdata[0]}} of %{{customdata[1]}} tokens (%{{x:.1f}}%)"
                          "<extra>%{y}</extra>",
        ))
    _style(fig, theme, "Who produced each token", "share of emitted tokens by tier and outcome",
           height=max(320, 170 + 80 * len(traces)),
           legend=dict(orientation="h", yanchor="top", y=-0.32 if len(traces) < 3 else -0.22, x=0,
                       font=dict(size=15), traceorder="normal"))
    fig.update_layout(barmode="stack", bargap=0.3)
    fig.update_xaxes(title_text="share of emitted tokens (%)", range=[0, 100], ticksuffix="%")
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(names)))
    return fig


# ---- acceptance by draft position ----------------------------------------------------------------

def acceptance_by_position(trace: Any) -> list[dict]:
    """Per draft position (1-based): drafted, kept (accepted or kept by a verifier), share kept."""
    trace = as_trace(trace)
    stats: dict[int, list[int]] = {}
    for c in trace.candidates():
        pos = int(c.get("pos", 0)) + 1
        s = stats.setdefault(pos, [0, 0])
        s[0] += 1
        s[1] += c.get("decision") in KEPT_DECISIONS
    return [{"position": pos, "drafted": d, "kept": k, "share": k / d if d else 0.0}
            for pos, (d, k) in sorted(stats.items())]


def acceptance_by_position_figure(traces: Any, theme: str = "light") -> go.Figure:
    """Per draft position 1..gamma, the share of drafted candidates that were kept, one line per trace.

    A candidate counts as kept when tier A accepted it or a verifier kept it; discarded drafts
    (after a replacement in their round) count as not kept, so the curve is the chance that a
    round's draft survives up to that position.
    """
    traces = [t for t in as_traces(traces) if t.method != "ar"]
    if not traces:
        return _empty("Drafts kept by position", "no drafting traces (AR drafts nothing)", theme)
    names = trace_names(traces)
    fig = new_figure()
    symbols = ["circle", "diamond", "square", "triangle-up", "cross"]
    gamma = 1
    for n, (trace, name) in enumerate(zip(traces, names)):
        rows = acceptance_by_position(trace)
        gamma = max([gamma] + [r["position"] for r in rows])
        dodge = (n - (len(traces) - 1) / 2) * 0.04  # lines that coincide stay visible side by side
        fig.add_trace(go.Scatter(
            x=[r["position"] + dodge for r in rows], y=[100 * r["share"] for r in rows], mode="lines+markers",
            name=name,
            line=dict(color=P.METHOD_COLORS.get(trace.method, P.OKABE_ITO["orange"]), width=3,
                      dash=("solid", "dash", "dot", "dashdot")[n % 4]),
            marker=dict(size=12, symbol=symbols[n % len(symbols)]),
            customdata=[[r["kept"], r["drafted"], r["position"]] for r in rows],
            hovertemplate="position %{customdata[2]}: %{customdata[0]} of %{customdata[1]} kept (%{y:.0f}%)"
                          f"<extra>{name}</extra>",
        ))
    _style(fig, theme, "Drafts kept by position in the round",
           "kept = accepted as drafted or kept by a verifier; drafts after a replacement count as not kept",
           height=520)
    fig.update_xaxes(title_text="draft position in the round", dtick=1, range=[0.7, gamma + 0.3])
    fig.update_yaxes(title_text="drafts kept (%)", range=[0, 105], ticksuffix="%")
    return fig


# ---- speed-up vs fidelity frontier ---------------------------------------------------------------

