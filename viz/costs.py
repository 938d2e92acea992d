""""Why this speed" and "Where it would pay": the cost model's numbers, drawn.

Plain numbers in, HTML and one Plotly figure out; the numbers come from the engine's cost model
(`via_sd.cost.model`, called by the app), never computed here. Every projected number carries the word
"projection" beside it.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import palette as P
from .figstyle import _empty, new_figure, _style
from .page import SHORT, esc, fmt, plural

EMPTY = ('<div class="via-costs" data-state="empty">After a run, this panel shows what a verification pass '
         'costs on this machine, this run\'s acceptance and tier shares, and the speed the cost model predicts '
         'next to the speed measured.</div>')
PROJECTION_EMPTY = ('<div class="via-projection" data-state="empty">Run once: the projection re-prices that run\'s '
                    'recorded rounds on another machine (a <b>projection</b>, nothing runs).</div>')


def cost_message_html(message: str) -> str:
    return f'<div class="via-costs" data-state="unavailable">{esc(message)}</div>'


def _x(v: Any) -> str:
    return fmt(v, ".2f", "×")


def cost_panel_html(info: dict) -> str:
    """`info`: device, source, gamma, alpha, c, s, V (of gamma+1), E, ceiling, tiers {draft, slim, full}
    (shares of VIA-SD's tokens), full_calls, rounds, best_gamma, measured {via_vs_ar, sd_vs_ar, via_vs_sd},
    predicted {same keys}, sentences [str]."""
    g, m, p = info.get("gamma"), info.get("measured") or {}, info.get("predicted") or {}
    tiers = info.get("tiers") or {}
    tier_txt = (f'tier A {fmt(tiers.get("draft"), ".0%")} · tier B {fmt(tiers.get("slim"), ".0%")} · '
                f'tier C {fmt(tiers.get("full"), ".0%")}' if tiers else "—")
    rows = "".join(
        f'<tr data-pair="{key}"><th>{label}</th><td data-kind="predicted">{_x(p.get(key))}</td>'
        f'<td data-kind="measured">{_x(m.get(key))}</td></tr>'
        for key, label in (("sd_vs_ar", "SD vs AR"), ("via_vs_ar", "VIA-SD vs AR"), ("via_vs_sd", "VIA-SD vs SD")))
    gk = g + 1 if isinstance(g, int) else None
    formula = (f'SD / AR = E / (γ·c + V(γ+1)) = {fmt(info.get("E"), ".2f")} / ({esc(g)} × {fmt(info.get("c"), ".2f")} + '
               f'{fmt(info.get("V"), ".2f")}) = <b>{_x(info.get("ceiling"))}</b>')
    sentences = "".join(f"<li>{esc(s)}</li>" for s in info.get("sentences", []))
    return (f'<div class="via-costs" data-state="ready">'
            f'<ul class="via-costs-plain">{sentences}</ul>'
            f'<div class="via-costs-grid">'
            f'<div class="via-card" data-cost="c"><div class="via-card-title">drafter step c</div>'
            f'<div class="via-card-value">{fmt(info.get("c"), ".2f")}</div>'
            f'<div class="via-card-note">of a one-token verifier pass</div></div>'
            f'<div class="via-card" data-cost="V"><div class="via-card-title">checking {esc(plural(gk, "token"))} '
            f'V({esc(gk)})</div><div class="via-card-value">{fmt(info.get("V"), ".2f")}</div>'
            f'<div class="via-card-note">one-token passes (1 = free, as on a GPU)</div></div>'
            f'<div class="via-card" data-cost="s"><div class="via-card-title">slim pass s</div>'
            f'<div class="via-card-value">{fmt(info.get("s"), ".2f")}</div>'
            f'<div class="via-card-note">of a full pass over the same tokens</div></div>'
            f'<div class="via-card" data-cost="alpha"><div class="via-card-title">acceptance α (SD)</div>'
            f'<div class="via-card-value">{fmt(info.get("alpha"), ".2f")}</div>'
            f'<div class="via-card-note">VIA-SD: {tier_txt}; full model in {esc(info.get("full_calls", "—"))} '
            f'of {esc(plural(info.get("rounds"), "round"))}</div></div></div>'
            f'<div class="via-costs-formula">{formula} <small>(the ceiling at γ = {esc(g)}, i.i.d. acceptance, '
            f'prompt reads left out)</small></div>'
            f'<table class="via-costs-table"><tr><th>speed-up</th><th>predicted</th><th>measured</th></tr>{rows}</table>'
            f'<div class="via-card-note">predicted: every forward this run made, priced by the cost profile '
            f'({esc(info.get("source", "measured"))}); measured: the run\'s wall clock.</div></div>')


def cost_curve_figure(ks: list[int], V: list[float], s: list[float], c: float | None, gamma: int | None,
                      device: str = "this machine", theme: str = "light") -> go.Figure:
    """V(k) = verify(k) / verify(1) against k as measured, beside flat (a memory-bound GPU) and
    proportional (k separate passes); the slim share s(k) and the drafter's c as dotted lines."""
    title = "What checking k tokens costs, in one-token verifier passes"
    if not ks:
        return _empty(title, "no cost profile recorded for this run", theme)
    fig = new_figure()
    fig.add_scatter(x=ks, y=[float(k) for k in ks], mode="lines", name="k separate passes",
                    line=dict(color=P.neutral_color(theme), dash="dot"))
    fig.add_scatter(x=ks, y=[1.0] * len(ks), mode="lines", name="flat: a memory-bound GPU",
                    line=dict(color=P.OKABE_ITO["bluish_green"], dash="dash"))
    fig.add_scatter(x=ks, y=V, mode="lines+markers", name=f"V(k) measured on {device}",
                    line=dict(color=P.OKABE_ITO["vermillion"], width=3))
    fig.add_scatter(x=ks, y=[sv * v for sv, v in zip(s, V)], mode="lines", name="slim pass over k tokens",
                    line=dict(color=P.OKABE_ITO["sky_blue"]))
    if c is not None:
        fig.add_scatter(x=ks, y=[c * k for k in ks], mode="lines", name=f"k drafter steps (c = {c:.2f})",
                        line=dict(color=P.OKABE_ITO["orange"], dash="dashdot"))
    if gamma is not None and 1 <= gamma + 1 <= len(V):
        fig.add_scatter(x=[gamma + 1], y=[V[gamma]], mode="markers", name=f"this run: γ+1 = {gamma + 1}",
                        marker=dict(size=16, symbol="diamond", color=P.OKABE_ITO["vermillion"],
                                    line=dict(width=2, color=P.neutral_color(theme))))
    _style(fig, theme, title, "1 = checking k drafts is free (GPU); k = no parallelism at all", height=460)
    fig.update_xaxes(title_text="k new tokens in one pass", dtick=2)
    top = max([float(len(ks))] + [v for v in V if v == v])  # a noisy slim curve may not squash the others
    fig.update_yaxes(title_text="cost (one-token passes)", range=[0, 1.12 * top])
    return fig


def projection_html(info: dict) -> str:
    """`info`: label, tokens_per_s {ar, sd, via}, speedup {via_vs_ar, sd_vs_ar, via_vs_sd}, V, c, s, gamma,
    sentence. Every number is a projection and says so."""
    sp, tps = info.get("speedup") or {}, info.get("tokens_per_s") or {}
    items = "".join(
        f'<div class="via-card" data-projection="{key}"><div class="via-card-title">{label}</div>'
        f'<div class="via-card-value">{_x(sp.get(key))}</div><div class="via-card-note">projection</div></div>'
        for key, label in (("via_vs_ar", "VIA-SD vs AR"), ("sd_vs_ar", "SD vs AR"), ("via_vs_sd", "VIA-SD vs SD")))
    rates = " · ".join(f"{SHORT[m]} {fmt(tps.get(m), '.1f')} tokens/s (projection)" for m in ("via", "sd", "ar")
                       if m in tps)
    shape = (f'V(γ+1) = {fmt(info.get("V"), ".2f")} (projection) · c = {fmt(info.get("c"), ".2f")} (projection) · '
             f's = {fmt(info.get("s"), ".2f")} (projection)')
    return (f'<div class="via-projection" data-state="ready" data-speedup="{fmt(sp.get("via_vs_ar"), ".4f")}">'
            f'<div class="via-estimate-badge">PROJECTION</div> <b>{esc(info.get("label", ""))}</b>'
            f'<div class="via-metrics">{items}</div><div class="via-card-sub">{rates}</div>'
            f'<div class="via-card-note">{shape}</div>'
            f'<p>{esc(info.get("sentence", ""))}</p></div>')
