"""The threshold lab's HTML: the what-if estimate card (from `viz.what_if`'s result) and its messages.

An estimate is always badged ESTIMATE: it re-tiers recorded drafts, it runs no model.
"""

from __future__ import annotations

import html

from .page import esc, fmt

EMPTY = ('<div class="via-whatif" data-state="empty">Run once (or upload a VIA-SD trace): moving the '
         'thresholds then re-tiers its recorded drafts instantly.</div>')


def what_if_error_html(message: str) -> str:
    return f'<div class="via-whatif" data-state="error">⚠ {esc(message)}</div>'


def what_if_card_html(est: dict) -> str:
    """The estimate card: tier counts, calls, rejection rate and tokens/s, estimate beside recorded."""
    rec = est["recorded"]

    def row(name, new, old, spec="d"):
        return f"<tr><td>{name}</td><td><b>{fmt(new, spec)}</b></td><td>{fmt(old, spec)}</td></tr>"

    tiers = est["tier_counts"]
    rows = "".join([
        row("tokens from tier A (accepted drafts)", tiers["draft"], rec["tier_counts"]["draft"]),
        row("tokens from tier B (slim verifier)", tiers["slim"], rec["tier_counts"]["slim"]),
        row("tokens from tier C (full model)", tiers["full"], rec["tier_counts"]["full"]),
        row("full-model calls", est["full_calls"], rec["full_calls"]),
        row("slim-verifier calls", est["slim_calls"], rec["slim_calls"]),
        row("rejection rate", est["rejection_rate"], rec["rejection_rate"], ".2f"),
        row("tokens / s", est["tokens_per_s"], rec["tokens_per_s"], ".1f"),
    ])
    speed = fmt(est["speedup_vs_recorded"], ".2f", "×")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in est["notes"])
    t = est["thresholds"]
    return (f'<div class="via-whatif" data-state="estimate" data-accept="{t["accept"]:.2f}" '
            f'data-escalate="{t["escalate"]:.2f}"><div class="via-estimate-badge">ESTIMATE</div>'
            f'<div class="via-whatif-head">accept {t["accept"]:.2f} · escalate {t["escalate"]:.2f} · signal '
            f'{esc(t["signal"])} → estimated speed <b>{speed}</b> of the recorded run</div>'
            f'<table><tr><th></th><th>estimate</th><th>recorded</th></tr>{rows}</table>'
            f'<div class="via-card-note">{html.escape(est["label"])}</div><ul>{notes}</ul></div>')
