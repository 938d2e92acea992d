"""The "learn" view: one recorded round at a time, every draft with its tier, its decision and why.

`explain_candidate` turns the round's numbers into one plain sentence; it knows the three ways a
draft can reach a verifier other than its thresholds say: a round forced to a verifier
(`round["forced_by"]`), a full pass that also decides the tier-B drafts before the first tier-C one
(drafter signal: one full pass decides them at no extra cost), and a full pass that checks every
draft after the first escalation.
"""

from __future__ import annotations

import html
from types import SimpleNamespace
from typing import Any

from via_sd.core.plan import Thresholds, tier_of

from .page import METHOD_TITLES, esc, fmt
from .palette import CANDIDATE_COLORS, text_color
from .tokens import candidate_label, token_html, visible_text

EMPTY = '<div class="via-learn" data-state="empty">Run once (or upload a trace) to step through its rounds.</div>'
FORCED = {"max_unverified": "too many tokens in a row had been kept with no verifier"}


def _q(text: str) -> str:
    return "«" + html.escape(visible_text(text or "")) + "»"


def _rule_tier(r: Any, accept: Any, escalate: Any) -> str | None:
    """The tier the engine's own rule (plan.tier_of) gives confidence `r` under these thresholds (None when
    unknown: a trace without them, or thresholds the engine would refuse)."""
    if not all(isinstance(x, (int, float)) for x in (r, accept, escalate)):
        return None
    try:
        return tier_of(r, Thresholds(accept=accept, escalate=escalate))
    except ValueError:
        return None


def explain_candidate(c: dict, trace: Any, rnd: dict, emitted: list[dict]) -> str:
    """One plain-language sentence from the numbers: why this draft got its tier and decision."""
    cands = rnd.get("candidates", [])
    pos, decision, tier = c.get("pos", 0), c.get("decision"), c.get("tier")
    replaced_at = next((x["pos"] for x in cands if x.get("decision") == "replaced"), None)
    out = emitted[pos] if pos < len(emitted) else None
    verdict = {"kept": "agreed, so the draft stays",
               "replaced": f"disagreed and put in {_q(out['text']) if out else 'its own token'}, which ends the round"}
    did = verdict.get(decision, esc(decision))
    if decision == "discarded":
        if replaced_at is not None and pos > replaced_at:
            return f"Discarded: draft #{replaced_at + 1} was replaced, so this draft no longer continues the text."
        return "Not used: the token budget or the end of the text was reached."
    if trace.method == "sd":
        return f"Plain SD: the full model checks every draft; it {did}."
    th = (trace.config or {}).get("thresholds") or {}
    a, e = th.get("accept"), th.get("escalate")
    r = c.get("confidence")
    name = "Drafter probability" if th.get("signal") == "draft" else "Confidence"
    by_rule = _rule_tier(r, a, e)
    r_txt, a_txt, e_txt = fmt(r), fmt(a), fmt(e)
    forced = rnd.get("forced_by")
    if tier == "draft":
        return f"{name} {r_txt} ≥ accept {a_txt}: tier A, accepted without any verifier."
    if forced and by_rule == "draft":
        why = FORCED.get(forced, esc(forced))
        who = "the slim verifier" if tier == "slim" else "the full model"
        return (f"{name} {r_txt} ≥ accept {a_txt} would keep it unverified, but {why}, so this round a verifier "
                f"sees every draft: {who} {did}.")
    if tier == "slim":
        return f"{name} {r_txt} lies between escalate {e_txt} and accept {a_txt}: tier B, the slim verifier {did}."
    first_c = next((x["pos"] for x in cands if _rule_tier(x.get("confidence"), a, e) == "full"), None)
    if by_rule == "slim" and first_c is not None and pos < first_c:
        return (f"{name} {r_txt} lies between escalate {e_txt} and accept {a_txt} (tier B), but draft "
                f"#{first_c + 1} needs the full model, and that one pass decides this draft too, at no extra "
                f"cost: the full model {did}.")
    if by_rule in ("slim", "draft") and first_c is not None and pos > first_c:
        return (f"After draft #{first_c + 1} escalated, the full model checks every later draft too "
                f"({name.lower()} {r_txt}): it {did}.")
    if by_rule == "full":
        return f"{name} {r_txt} < escalate {e_txt}: tier C, deferred to the full model, which {did}."
    return f"The full model checked this draft ({name.lower()} {r_txt}): it {did}."


def _bonus_html(emitted: list[dict]) -> str:
    bonus = [t for t in emitted if t.get("outcome") == "bonus"]
    if not bonus:
        return ""
    who = {"slim": "the slim verifier", "full": "the full model"}.get(bonus[0].get("tier"), "the verifier")
    return (f"<p>Every draft was kept, so {who} added one token of its own for free: "
            f"{_q(bonus[0].get('text', ''))} (the bonus token).</p>")


def _summary(trace: Any, rnd: dict, cands: list[dict], emitted: list[dict]) -> str:
    if trace.method == "ar":
        return "Autoregressive: the full model emits one token per round; nothing is drafted."
    # a discarded draft keeps the tier it was sorted into, but no tier decided it: the table's rows say so too
    tiers = [c.get("tier") for c in cands if c.get("decision") != "discarded"]
    discarded = f", {len(cands) - len(tiers)} discarded (never decided)" if len(tiers) < len(cands) else ""
    forced = (f" This round was forced to a verifier: {FORCED.get(rnd['forced_by'], esc(rnd['forced_by']))}."
              if rnd.get("forced_by") else "")
    return (f"The drafter proposed {len(cands)} token(s) in {fmt(rnd.get('draft_ms', 0.0), '.0f')} ms. "
            f"{tiers.count('draft')} went to tier A (kept as drafted), {tiers.count('slim')} to tier B (slim "
            f"verifier, {fmt(rnd.get('slim_ms', 0.0), '.0f')} ms), {tiers.count('full')} to tier C (full model)"
            f"{discarded}. "
            + (f"The full model ran ({fmt(rnd.get('full_ms') or 0.0, '.0f')} ms)." if rnd.get("full_called") else
               "The full model did not run this round.")
            + f" {len(emitted)} token(s) were emitted.{forced}")


def learn_html(trace: Any, k: int) -> str:
    """Round k (0-based) of `trace`: what was drafted, each tier's decision and why."""
    if trace is None or not trace.rounds:
        return EMPTY
    rnd = trace.rounds[k]
    cands = rnd.get("candidates", [])
    emitted = [t for t in trace.tokens if t.get("round") == rnd.get("round")]
    before = "".join(t.get("text", "") for t in trace.tokens if t.get("round", 0) < rnd.get("round", k))
    rows = []
    for c in cands:
        label = candidate_label(c)
        color = CANDIDATE_COLORS[label]
        chip = (f'<span class="via-chip" style="background:{color};color:{text_color(color)}">'
                f'{html.escape(visible_text(c.get("text", "")))}</span>')
        rows.append(f'<tr data-decision="{esc(c.get("decision"))}"><td>{esc(c.get("pos", 0) + 1)}</td><td>{chip}</td>'
                    f'<td>{fmt(c.get("p_draft"), ".3f")}</td><td>{fmt(c.get("q_slim"), ".3f")}</td>'
                    f'<td>{fmt(c.get("q_full"), ".3f")}</td><td>{fmt(c.get("confidence"), ".3f")}</td>'
                    f'<td>{html.escape(label)}</td>'
                    f'<td class="via-why">{explain_candidate(c, trace, rnd, emitted)}</td></tr>')
    shown = SimpleNamespace(method=trace.method, prompt="", tokens=emitted, rounds=[], config=trace.config)
    return (f'<div class="via-learn" data-state="round" data-round="{k}"><h3>{METHOD_TITLES[trace.method]} · round '
            f'{k + 1} of {len(trace.rounds)}</h3><p class="via-learn-summary">'
            f'{_summary(trace, rnd, cands, emitted)}</p>'
            f'<div class="via-learn-context"><b>Text so far</b> …{html.escape(before[-160:])}</div>'
            f'<table class="via-learn-table"><tr><th>#</th><th>draft</th><th>p draft</th><th>q slim</th>'
            f'<th>q full</th><th>r</th><th>what happened</th><th>why</th></tr>{"".join(rows)}</table>'
            f'{_bonus_html(emitted)}<div><b>Emitted this round</b></div>{token_html(shown, legend=False)}</div>')


def learn_error_html(message: str) -> str:
    return f'<div class="via-learn" data-state="error">⚠ {esc(message)}</div>'
