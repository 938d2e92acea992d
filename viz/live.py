"""A round being verified, live: its drafts appear at once, pending, then take their tier's color.

`round_html(candidates, round_index)` draws one round's draft candidates (the dicts of a
`via_sd.core.decoding.Event`): a pending draft is neutral (dashed outline, `data-state="pending"`); a
decided one has its label's color (`data-state="decided"`); a replaced draft is struck through
with the replacement beside it when the event names it; a discarded one is faded and struck.
`live_tokens_html(trace, candidates, round_index)` puts the emitted tokens so far and that round
into one flowing text, so the pane does not jump when the round is recorded.
"""

from __future__ import annotations

import html
from typing import Any

from . import palette as P
from .tokens import _CONTAINER_STYLE, _chip, candidate_label, token_html, visible_text

# Same box as a decided chip (padding, radius), so nothing moves when the tier color arrives.
PENDING_STYLE = ("background:rgba(127,127,127,0.22); color:inherit; outline:2px dashed rgba(127,127,127,0.95); "
                 "outline-offset:-2px; border-radius:4px; padding:2px 1px; margin-right:1px; "
                 "box-decoration-break:clone; -webkit-box-decoration-break:clone;")


def _replacement(c: dict) -> str | None:
    """The text a verifier put in place of a replaced draft, when the event carries it."""
    for key in ("replacement_text", "out_text", "replacement"):
        value = c.get(key)
        if isinstance(value, str):
            return value
    return None


def round_html(candidates: list[dict], round_index: int | None = None) -> str:
    """One round's drafted candidates as inline chips (no container)."""
    rnd = html.escape(str(round_index if round_index is not None else ""), quote=True)
    out = []
    for c in candidates or []:
        pos = int(c.get("pos", 0)) if isinstance(c.get("pos", 0), int) else 0
        text = visible_text(str(c.get("text", "")))
        decision = c.get("decision")
        base = f' data-round="{rnd}" data-pos="{pos}"'
        if decision in (None, "pending") or (c.get("tier") is None and decision != "discarded"):
            out.append(f'<span class="via-live via-live-pending" data-state="pending"{base} '
                       f'title="drafted, waiting for its tier" style="{PENDING_STYLE}">'
                       f'{html.escape(text, quote=False)}</span>')
            continue
        label = candidate_label(c)
        attrs = (f' class="via-live" data-state="decided" data-decision="{html.escape(str(decision), quote=True)}"'
                 f'{base} data-label="{html.escape(label, quote=True)}"')
        if decision == "discarded":
            out.append(_chip(text, P.CANDIDATE_COLORS[label], label, attrs=attrs,
                             extra="text-decoration:line-through; opacity:0.45;"))
        elif decision == "replaced":
            out.append(_chip(text, P.CANDIDATE_COLORS[label], f"{label}: draft replaced", attrs=attrs,
                             extra="text-decoration:line-through; text-decoration-thickness:2px; opacity:0.7;"))
            new = _replacement(c)
            if new is not None:
                out.append(_chip(visible_text(new), P.CANDIDATE_COLORS[label], f"{label}: its replacement",
                                 attrs=f' class="via-live via-live-replacement" data-state="decided"{base}'))
        else:
            out.append(_chip(text, P.CANDIDATE_COLORS[label], label, attrs=attrs))
    return "".join(out)


def live_tokens_html(trace: Any, candidates: list[dict] | None = None, round_index: int | None = None) -> str:
    """The emitted tokens of `trace` (or none) followed by the live round, in one `.via-sd-tokens` block."""
    live = round_html(candidates or [], round_index)
    if trace is None or not getattr(trace, "tokens", None):
        return f'<div class="via-sd-tokens" style="{_CONTAINER_STYLE}">{live}</div>'
    body = token_html(trace, legend=False)
    return body[: -len("</div>")] + live + "</div>" if live else body
