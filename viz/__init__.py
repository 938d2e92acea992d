"""viz: a VIA-SD Trace as tier-colored tokens and Plotly figures.

No model code here (no torch, no transformers) and no gradio: only `via_sd.core.trace` is used, and
only to turn a dict / JSON into a Trace. Every function takes a `via_sd.Trace` (or its dict).

    from viz import token_spans, TIER_COLORS, token_html, confidence_figure, what_if
    gr.HighlightedText(token_spans(trace), color_map=TIER_COLORS, combine_adjacent=False)
    gr.HTML(token_html(trace))
    gr.Plot(confidence_figure(trace, theme="dark"))
    est = what_if(trace, Thresholds(accept=0.8, escalate=0.3))   # est["estimate"] is True
"""

from .bench_figures import frontier_figure, speedup_figure
from .figstyle import trace_names
from .figures import (
    acceptance_by_position,
    acceptance_by_position_figure,
    confidence_figure,
    latency_figure,
    tier_mix_figure,
)
from .palette import (
    CANDIDATE_COLORS,
    COLOR_BY_TIER,
    LABELS_BY_METHOD,
    METHOD_COLORS,
    METHOD_NAMES,
    OKABE_ITO,
    PHASE_COLORS,
    THEMES,
    TIER_COLORS,
    text_color,
)
from .tokens import candidate_label, legend_html, token_html, token_label, token_spans, token_tooltip, visible_text
from .what_if import ESTIMATE_LABEL, phase_costs, what_if

__all__ = [
    "CANDIDATE_COLORS", "COLOR_BY_TIER", "ESTIMATE_LABEL", "LABELS_BY_METHOD", "METHOD_COLORS", "METHOD_NAMES",
    "OKABE_ITO", "PHASE_COLORS", "THEMES", "TIER_COLORS",
    "acceptance_by_position", "acceptance_by_position_figure", "candidate_label", "confidence_figure",
    "frontier_figure", "latency_figure", "legend_html", "phase_costs", "speedup_figure", "text_color",
    "tier_mix_figure", "token_html", "token_label", "token_spans", "token_tooltip", "trace_names",
    "visible_text", "what_if",
]
