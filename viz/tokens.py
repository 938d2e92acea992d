"""Emitted tokens colored by tier: spans for `gr.HighlightedText` and self-contained HTML.

Each token gets one plain-words label (see `viz.palette`): "accepted draft", "slim verifier: kept",
"slim verifier: regenerated", "full model: kept", "full model: corrected", "bonus", and for
autoregressive traces "full model (autoregressive)".
"""

from __future__ import annotations

import html
from typing import Any

from . import palette as P
from ._trace import as_trace, fmt_prob

NBSP = "\u00a0"
NEWLINE_MARK = "\u21b5"  # ↵
TAB_MARK = "\u21e5"  # ⇥
EMPTY_MARK = "\u2205"  # ∅ (a token that decodes to no text, e.g. a special token)

TIER_LETTER = {"draft": "A", "slim": "B", "full": "C"}


def token_label(token: dict, method: str = "via") -> str:
    """The plain-words label of one emitted token (`trace.tokens[i]`)."""
    if method == "ar":
        return P.AUTOREGRESSIVE
    outcome, tier = token.get("outcome"), token.get("tier")
    if outcome == "bonus":
        return P.BONUS
    if tier == "draft":
        return P.ACCEPTED_DRAFT
    if tier == "slim":
        return P.SLIM_REGENERATED if outcome == "replaced" else P.SLIM_KEPT
    return P.FULL_CORRECTED if outcome == "replaced" else P.FULL_KEPT


def candidate_label(candidate: dict) -> str:
    """The label of one drafted candidate (`trace.candidates()[j]`); discarded ones get their own."""
    decision, tier = candidate.get("decision"), candidate.get("tier")
    if decision == "discarded":
        return P.DISCARDED
    if decision == "accepted" or tier == "draft":
        return P.ACCEPTED_DRAFT
    if tier == "slim":
        return P.SLIM_REGENERATED if decision == "replaced" else P.SLIM_KEPT
    return P.FULL_CORRECTED if decision == "replaced" else P.FULL_KEPT


def visible_text(text: str) -> str:
    """Token text with its whitespace made visible: newline -> "↵\\n", tab -> "⇥\\t", leading /
    trailing / repeated spaces -> no-break spaces (they do not collapse), empty -> "∅"."""
    if text == "":
        return EMPTY_MARK
    out = text.replace("\n", NEWLINE_MARK + "\n").replace("\t", TAB_MARK + "\t")
    stripped = out.lstrip(" ")
    lead = len(out) - len(stripped)
    core = stripped.rstrip(" ")
    trail = len(stripped) - len(core)
    while "  " in core:
        core = core.replace("  ", " " + NBSP)
    return NBSP * lead + core + NBSP * trail


def plain_text(shown: str) -> str:
    """Undo `visible_text` (except for "∅", which stands for an empty token)."""
    if shown == EMPTY_MARK:
        return ""
    return shown.replace(NEWLINE_MARK + "\n", "\n").replace(TAB_MARK + "\t", "\t").replace(NBSP, " ")


def token_spans(trace: Any, visible_whitespace: bool = True) -> list[tuple[str, str]]:
    """`(text, label)` pairs, one per emitted token, for
    `gr.HighlightedText(value=token_spans(trace), color_map=TIER_COLORS, combine_adjacent=False)`.

    With `visible_whitespace=False` the texts are the raw token texts (they concatenate to the
    decoded tokens); otherwise see `visible_text`.
    """
    trace = as_trace(trace)
    show = visible_text if visible_whitespace else (lambda s: s)
    return [(show(t.get("text", "")), token_label(t, trace.method)) for t in trace.tokens]


def token_tooltip(token: dict, method: str = "via") -> str:
    """What hovering a token tells: label, tier, round, the three probabilities and r."""
    label = token_label(token, method)
    tier = token.get("tier", "full")
    lines = [
        label,
        f"tier {TIER_LETTER.get(tier, '?')} ({tier}) · round {token.get('round', '?')}"
        f" · token #{token.get('i', '?')}",
        f"p_draft {fmt_prob(token.get('p_draft'))} · q_slim {fmt_prob(token.get('q_slim'))}"
        f" · q_full {fmt_prob(token.get('q_full'))}",
        f"confidence r {fmt_prob(token.get('confidence'))}"
        + (" (of the draft it replaced)" if token.get("outcome") == "replaced" else ""),
        f"token id {token.get('id', '?')} · text {token.get('text', '')!r}",
    ]
    return "\n".join(lines)


_CONTAINER_STYLE = (
    "white-space: pre-wrap; word-break: break-word; line-height: 2.1; font-size: 17px; "
    "font-family: ui-sans-serif, system-ui, -apple-system, 'Segoe UI', sans-serif;"
)


def _chip(text: str, color: str, title: str | None = None, extra: str = "", attrs: str = "") -> str:
    style = (
        f"background:{color}; color:{P.text_color(color)}; border-radius:4px; "
        f"padding:2px 1px; margin-right:1px; box-decoration-break:clone; "
        f"-webkit-box-decoration-break:clone; {extra}"
    )
    title_attr = f' title="{html.escape(title, quote=True).replace(chr(10), "&#10;")}"' if title else ""
    return f'<span{attrs} style="{style}"{title_attr}>{html.escape(text, quote=False)}</span>'


def legend_html(method: str = "via", labels: list[str] | None = None) -> str:
    """A row of colored chips naming each label (`labels` defaults to those `method` can emit)."""
    labels = labels if labels is not None else P.LABELS_BY_METHOD.get(method, list(P.TIER_COLORS))
    chips = "".join(
        _chip(lab, P.CANDIDATE_COLORS[lab], extra="padding:2px 8px; margin-right:6px; white-space:nowrap;",
              attrs=' class="via-legend-item"')
        for lab in labels
    )
    return f'<div class="via-sd-legend" style="{_CONTAINER_STYLE} line-height:2.4;">{chips}</div>'


def token_html(trace: Any, legend: bool = True) -> str:
    """The emitted tokens as HTML: one escaped `<span>` per token, its background the label color,
    its text black or white for contrast (readable on light and dark pages), and a hover tooltip
    (the `title` attribute) with label, tier, round, p_draft, q_slim, q_full and confidence r."""
    trace = as_trace(trace)
    spans = []
    for t in trace.tokens:
        label = token_label(t, trace.method)
        attrs = (
            f' class="via-tok" data-i="{int(t.get("i", 0))}" data-round="{html.escape(str(t.get("round", "")))}"'
            f' data-label="{html.escape(label, quote=True)}"'
        )
        spans.append(_chip(visible_text(t.get("text", "")), P.TIER_COLORS[label], token_tooltip(t, trace.method),
                           attrs=attrs))
    body = f'<div class="via-sd-tokens" style="{_CONTAINER_STYLE}">{"".join(spans)}</div>'
    return (legend_html(trace.method) if legend else "") + body
