"""The shared look of every viz figure: title block, projector-size fonts, transparent background,
empty-figure message, display names, and text made safe for Plotly labels."""

from __future__ import annotations

import functools
import html
import json

import plotly.graph_objects as go
import plotly.io as pio

from . import palette as P
from ._trace import trace_thresholds
from .tokens import visible_text

def _hover_text(text: str) -> str:
    """Token text for a Plotly hover label: whitespace visible, one line, HTML shown as text."""
    return html.escape(visible_text(text).replace("\n", ""), quote=False)


def _esc(value) -> str:
    """Any other value from a trace, as text in a Plotly label (which renders a subset of HTML)."""
    return html.escape(str(value), quote=False)


# ---- shared layout -------------------------------------------------------------------------------

def new_figure() -> go.Figure:
    """An empty figure that skips Plotly's per-property validation: it re-checks every key of every layout update
    and was most of a figure's build time (the hostile-upload test draws hundreds). The JSON a browser gets is the
    same as a validated figure's (tests/test_viz.py compares them), the template given as the dict Plotly would
    resolve its name to."""
    return go.Figure(_validate=False)


@functools.cache
def _template_json(name: str) -> str:
    return json.dumps(pio.templates[name].to_plotly_json())


def _template(name: str) -> dict:
    """The template as a dict of the figure's own (an unvalidated figure keeps the very dict it is given)."""
    return json.loads(_template_json(name))


def _title(text: str, subtitle: str | None = None) -> dict:
    title = dict(text=text, x=0.0, xref="paper", xanchor="left", y=1.0, yref="container", yanchor="top",
                 pad=dict(t=14), font=dict(size=22))
    if subtitle:
        title["subtitle"] = dict(text=subtitle, font=dict(size=15))
    return title


def _style(fig: go.Figure, theme: str, title: str, subtitle: str | None = None, height: int = 540,
           legend: dict | None = None, notes: list[str] | None = None) -> go.Figure:
    """Template, title (+ subtitle and notes lines), projector-size fonts, transparent background
    (the page's light or dark background shows through)."""
    lines = [x for x in [subtitle, *(notes or [])] if x]
    fig.layout.template = _template(P.template_for(theme))  # set, not merged into Plotly's default template
    fig.update_layout(
        title=_title(title, "<br>".join(lines) if lines else None),
        font=dict(size=P.FONT_SIZE),
        height=height,
        margin=dict(l=80, r=30, t=62 + 21 * sum(x.count("<br>") + 1 for x in lines), b=70),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        hoverlabel=dict(font_size=15),
        showlegend=True,
        legend=legend or dict(font=dict(size=15), title_font=dict(size=15)),
    )
    fig.update_xaxes(title_font=dict(size=18), tickfont=dict(size=15), automargin=True)
    fig.update_yaxes(title_font=dict(size=18), tickfont=dict(size=15), automargin=True)
    return fig


def _empty(title: str, message: str, theme: str) -> go.Figure:
    fig = _style(new_figure(), theme, title, height=360)
    fig.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font=dict(size=18, color=P.neutral_color(theme)))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def trace_names(traces: list) -> list[str]:
    """Display names: the method's name, plus signal and thresholds where two traces would share one."""
    base = [P.method_name(t.method) for t in traces]
    names = []
    for t, name in zip(traces, base):
        th = trace_thresholds(t)
        if base.count(name) > 1 and th:
            name = f"{name} ({th['signal']}, {th['accept']:.2f}/{th['escalate']:.2f})"
        names.append(name)
    return names


