"""viz: tier-colored tokens, Plotly figures and the what-if estimate, on real tiny-model traces.

The ar / sd / via traces come from the engine on the `tiny_pair` fixture (tests/conftest.py);
`hand_trace()` builds a small schema-exact VIA-SD trace by hand for the cases a random model will
not produce on demand (HTML in a token, newlines, leading spaces).
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import pytest

import viz
from via_sd.core.trace import Trace, summarize
from viz import palette as P
from viz.tokens import NBSP, plain_text

ROOT = Path(__file__).resolve().parents[1]
ACCEPT, ESCALATE = 0.6, 0.2


# ---- traces ----------------------------------------------------------------------------------------

def _run(pair, method, signal="slim", temperature=0.0, accept=ACCEPT, escalate=ESCALATE):
    from via_sd import DecodeConfig, Thresholds, generate

    cfg = DecodeConfig(gamma=4, max_new_tokens=24, temperature=temperature, seed=0,
                       thresholds=Thresholds(accept=accept, escalate=escalate, signal=signal))
    return generate(pair, "hello world", method=method, config=cfg)


@pytest.fixture(scope="module")
def traces(request):
    """Real traces: ar, sd, via (slim signal), via_draft (draft signal), via_sampled (temperature 0.8)."""
    try:
        pair = request.getfixturevalue("tiny_pair")
    except pytest.FixtureLookupError:  # engine fixture missing: hand-built traces of the same shape
        from viz.sample import sample_trace

        return {"ar": sample_trace("ar"), "sd": sample_trace("sd"), "via": sample_trace("via"),
                "via_draft": sample_trace("via", signal="draft", seed=1),
                "via_sampled": sample_trace("via", seed=2)}
    return {"ar": _run(pair, "ar"), "sd": _run(pair, "sd"), "via": _run(pair, "via"),
            "via_draft": _run(pair, "via", signal="draft"),
            "via_sampled": _run(pair, "via", temperature=0.8)}


@pytest.fixture(scope="module")
def routed_via(request):
    """A VIA-SD trace whose slim verifier really differs from the full one (two sub-layers skipped)."""
    try:
        pair = request.getfixturevalue("tiny_routed_pair")
    except pytest.FixtureLookupError:
        from viz.sample import sample_trace

        return sample_trace("via", seed=3)
    return _run(pair, "via", accept=0.8, escalate=0.3)


def _cand(pos, text, p, r, tier, decision, q_slim=None, q_full=None):
    return {"pos": pos, "token": 100 + pos, "text": text, "p_draft": p, "q_slim": q_slim, "q_full": q_full,
            "confidence": r, "tier": tier, "decision": decision}


def _tok(text, rnd, tier, outcome, p=None, qs=None, qf=None, r=None):
    return {"id": 7, "text": text, "round": rnd, "tier": tier, "outcome": outcome, "p_draft": p, "q_slim": qs,
            "q_full": qf, "confidence": r}


def hand_trace() -> Trace:
    """Three rounds of VIA-SD (accept 0.6, escalate 0.2, signal slim, gamma 3), built by hand.

    round 0: "<b>" tier A, " two" tier B kept, "\\n" tier B: the slim verifier regenerates " &x".
    round 1: "  lead" tier A, "q" r < escalate: the full model corrects it into "\\n"; " z" discarded.
    round 2: " a" tier A, " b" tier B kept, " c" tier C kept; bonus "end" from the full model.
    """
    rounds = [
        {"round": 0, "start_ms": 5.0, "draft_ms": 6.0, "slim_ms": 4.0, "full_ms": 0.0, "other_ms": 0.5,
         "full_called": False, "slim_called": True, "candidates": [
             _cand(0, "<b>", 0.9, 1.0, "draft", "accepted", 0.8),
             _cand(1, " two", 0.5, 1.0, "slim", "kept", 0.5),
             _cand(2, "\n", 0.4, 0.3, "slim", "replaced", 0.2)]},
        {"round": 1, "start_ms": 15.5, "draft_ms": 6.0, "slim_ms": 4.0, "full_ms": 9.0, "other_ms": 0.5,
         "full_called": True, "slim_called": True, "candidates": [
             _cand(0, "  lead", 0.8, 0.9, "draft", "accepted", 0.6),
             _cand(1, "q", 0.3, 0.1, "full", "replaced", 0.05, 0.1),
             _cand(2, " z", 0.3, 0.7, "draft", "discarded", 0.4)]},
        {"round": 2, "start_ms": 35.0, "draft_ms": 6.0, "slim_ms": 4.0, "full_ms": 9.0, "other_ms": 0.5,
         "full_called": True, "slim_called": True, "candidates": [
             _cand(0, " a", 0.9, 1.0, "draft", "accepted", 0.9),
             _cand(1, " b", 0.6, 1.0, "slim", "kept", 0.5),
             _cand(2, " c", 0.2, 0.1, "full", "kept", 0.1, 0.7)]},
    ]
    tokens = [
        _tok("<b>", 0, "draft", "kept", 0.9, 0.8, None, 1.0),
        _tok(" two", 0, "slim", "kept", 0.5, 0.5, None, 1.0),
        _tok(" &x", 0, "slim", "replaced", 0.1, 0.6, None, 0.3),
        _tok("  lead", 1, "draft", "kept", 0.8, 0.6, None, 0.9),
        _tok("\n", 1, "full", "replaced", 0.1, None, 0.8, 0.1),
        _tok(" a", 2, "draft", "kept", 0.9, 0.9, None, 1.0),
        _tok(" b", 2, "slim", "kept", 0.6, 0.5, None, 1.0),
        _tok(" c", 2, "full", "kept", 0.2, 0.1, 0.7, 0.1),
        _tok("end", 2, "full", "bonus", None, None, 0.9, None),
    ]
    for i, t in enumerate(tokens):
        t["i"] = i
    config = {"gamma": 3, "max_new_tokens": 9, "temperature": 0.0, "top_p": 1.0, "seed": 0,
              "thresholds": {"accept": ACCEPT, "escalate": ESCALATE, "signal": "slim"}}
    return Trace(method="via", prompt="p", text="".join(t["text"] for t in tokens), token_ids=[7] * len(tokens),
                 config=config, tokens=tokens, rounds=rounds, summary=summarize(tokens, rounds, 5.0, 55.0))


def _marker_traces(fig: go.Figure) -> list:
    return [t for t in fig.data if t.type == "scatter" and "markers" in (t.mode or "")]


def _hlines(fig: go.Figure) -> list[float]:
    return sorted(s.y0 for s in fig.layout.shapes if s.type == "line" and s.y0 == s.y1)


# ---- tokens ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["ar", "sd", "via", "via_draft"])
def test_spans_concatenate_to_the_text_and_carry_known_labels(traces, method):
    trace = traces[method]
    raw = viz.token_spans(trace, visible_whitespace=False)
    assert len(raw) == len(trace.tokens) == trace.summary["new_tokens"]
    assert "".join(text for text, _ in raw) == trace.text
    assert {label for _, label in raw} <= set(viz.LABELS_BY_METHOD[trace.method])
    shown = viz.token_spans(trace)
    assert [lab for _, lab in shown] == [lab for _, lab in raw]
    assert "".join(plain_text(text) for text, _ in shown) == trace.text


def test_labels_follow_tier_and_outcome(traces):
    via = traces["via"]
    labels = [lab for _, lab in viz.token_spans(via)]
    tiers = via.summary["tier_counts"]
    bonus = sum(t["outcome"] == "bonus" for t in via.tokens)
    assert labels.count(P.BONUS) == bonus
    non_bonus_draft = sum(t["tier"] == "draft" and t["outcome"] != "bonus" for t in via.tokens)
    assert labels.count(P.ACCEPTED_DRAFT) == non_bonus_draft <= tiers["draft"]
    assert labels.count(P.SLIM_REGENERATED) == sum(t["tier"] == "slim" and t["outcome"] == "replaced"
                                                   for t in via.tokens)
    assert {lab for _, lab in viz.token_spans(traces["ar"])} == {P.AUTOREGRESSIVE}


def test_whitespace_stays_visible():
    trace = hand_trace()
    shown = dict(enumerate(text for text, _ in viz.token_spans(trace)))
    assert shown[4] == "↵\n"  # the newline token
    assert shown[3] == NBSP * 2 + "lead"  # leading spaces do not collapse
    assert shown[1] == NBSP + "two"
    assert viz.visible_text("") == "∅"


def test_token_html_is_escaped_and_has_tooltips():
    trace = hand_trace()
    out = viz.token_html(trace)
    assert "<b>" not in out and "&lt;b&gt;" in out
    assert "&amp;x" in out and " &x" not in out
    spans = re.findall(r'<span class="via-tok"[^>]*>', out)
    assert len(spans) == len(trace.tokens)
    title = html.unescape(re.search(r'title="([^"]*)"', spans[2]).group(1))
    for field in ("slim verifier: regenerated", "tier B", "round 0", "p_draft 0.100", "q_slim 0.600",
                  "q_full —", "confidence r 0.300"):
        assert field in title
    assert 'class="via-sd-legend"' in out and 'class="via-sd-legend"' not in viz.token_html(trace, legend=False)


def test_plot_hovers_show_token_html_as_text():
    fig = viz.confidence_figure(hand_trace())
    texts = [row[0] for t in _marker_traces(fig) for row in t.customdata]
    assert "&lt;b&gt;" in texts and "<b>" not in texts
    assert "↵" in texts  # the newline draft, visible and on one line


def test_token_text_color_has_contrast_on_every_label():
    for label, color in P.CANDIDATE_COLORS.items():
        assert P.contrast(color, P.text_color(color)) >= 4.5, label
    out = viz.token_html(hand_trace())
    for bg, fg in re.findall(r"background:(#[0-9A-F]{6}); color:(#[0-9A-F]{6})", out):
        assert fg == P.text_color(bg)


def test_each_label_has_one_color_in_tokens_and_plots(traces, routed_via):
    for trace in (traces["via"], routed_via, hand_trace()):
        out = viz.token_html(trace, legend=False)
        for label, bg in re.findall(r'data-label="([^"]+)" style="background:(#[0-9A-F]{6})', out):
            assert viz.TIER_COLORS[html.unescape(label)] == bg
        fig = viz.confidence_figure(trace)
        for t in _marker_traces(fig):
            assert t.marker.color == viz.CANDIDATE_COLORS[t.name]
        mix = viz.tier_mix_figure(trace)
        for t in mix.data:
            assert t.marker.color == viz.TIER_COLORS[t.name]
    # the shaded tier bands use each tier's "kept" color
    assert viz.COLOR_BY_TIER == {"draft": viz.TIER_COLORS["accepted draft"],
                                 "slim": viz.TIER_COLORS["slim verifier: kept"],
                                 "full": viz.TIER_COLORS["full model: kept"]}


# ---- confidence figure ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["via", "via_draft", "via_sampled"])
def test_confidence_figure_plots_every_candidate_and_the_thresholds(traces, method):
    trace = traces[method]
    fig = viz.confidence_figure(trace)
    points = _marker_traces(fig)
    cands = trace.candidates()
    assert sum(len(t.x) for t in points) == len(cands) == trace.summary["drafted"]
    assert _hlines(fig) == sorted([ESCALATE, ACCEPT])
    bands = sorted((s.y0, s.y1) for s in fig.layout.shapes if s.type == "rect")
    assert bands == [(0.0, ESCALATE), (ESCALATE, ACCEPT), (ACCEPT, 1.0)]
    # every point sits at its candidate's recorded confidence, in its label's trace
    by_label = {t.name: sorted(t.y) for t in points}
    for label in by_label:
        expected = sorted(c["confidence"] for c in cands if viz.candidate_label(c) == label)
        assert by_label[label] == pytest.approx(expected)
    discarded = sum(c["decision"] == "discarded" for c in cands)
    assert len(next((t.x for t in points if t.name == P.DISCARDED), [])) == discarded
    assert fig.layout.title.text and fig.layout.xaxis.title.text and "confidence" in fig.layout.yaxis.title.text
    assert fig.layout.font.size >= 16


def test_confidence_figure_for_sd_and_ar(traces):
    sd = viz.confidence_figure(traces["sd"])
    assert sum(len(t.x) for t in _marker_traces(sd)) == len(traces["sd"].candidates())
    assert _hlines(sd) == []  # plain SD has no thresholds
    assert sd.layout.yaxis.title.text == "drafter probability p(x)"
    assert {t.name for t in _marker_traces(sd)} <= {P.FULL_KEPT, P.FULL_CORRECTED, P.DISCARDED}
    ar = viz.confidence_figure(traces["ar"])
    assert _marker_traces(ar) == [] and "drafts nothing" in ar.layout.annotations[0].text


def test_confidence_figure_what_if_is_labelled_an_estimate(traces):
    fig = viz.confidence_figure(traces["via"], thresholds={"accept": 0.9, "escalate": 0.5})
    assert "ESTIMATE" in fig.layout.title.text
    assert _hlines(fig) == [0.5, 0.9]
    assert sum(len(t.x) for t in _marker_traces(fig)) == len(traces["via"].candidates())


# ---- what-if -------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["via", "via_draft", "via_sampled"])
def test_what_if_with_own_thresholds_reproduces_the_recording(traces, method):
    trace = traces[method]
    est = viz.what_if(trace, trace.config["thresholds"])
    assert est["estimate"] is True and "estimate" in est["label"]
    assert est["tier_counts"] == trace.summary["tier_counts"]
    assert est["full_calls"] == trace.summary["full_calls"]
    assert est["slim_calls"] == trace.summary["slim_calls"]
    assert est["new_tokens"] == trace.summary["new_tokens"]
    assert est["rejection_rate"] == pytest.approx(trace.summary["rejection_rate"])
    assert est["changed_rounds"] == 0 and est["guessed_decisions"] == 0
    assert est["forced_rounds"] == est["recorded"]["forced_rounds"]
    from via_sd.cost.model import CostProfile, price_calls

    # the trace's own forwards priced with its own cost profile (the engine's cost model, one copy)
    assert est["model_ms"] == pytest.approx(price_calls(CostProfile.from_dict(trace.costs), trace.rounds))
    assert est["speedup_vs_recorded"] == pytest.approx(1.0)
    old = viz.what_if({**trace.to_dict(), "costs": {}}, trace.config["thresholds"])  # a trace from before profiles
    phases = sum(r["draft_ms"] + r["slim_ms"] + r["full_ms"] + r["other_ms"] for r in trace.rounds)
    assert old["model_ms"] == pytest.approx(phases) and old["tier_counts"] == trace.summary["tier_counts"]


def test_what_if_accepts_thresholds_objects(traces, routed_via):
    from via_sd import Thresholds

    for trace in (traces["via"], routed_via):
        th = Thresholds(**trace.config["thresholds"])
        assert viz.what_if(trace, th)["tier_counts"] == trace.summary["tier_counts"]


def test_what_if_accept_everything_calls_no_full_model(traces):
    from dataclasses import replace

    # a limit far away, so every draft becomes a tier-A token (the run's own limit caps the estimate)
    trace = replace(traces["via"], config={**traces["via"].config, "max_new_tokens": 10**6, "max_unverified": 0})
    est = viz.what_if(trace, {"accept": 0.0, "escalate": 0.0})
    assert est["full_calls"] == 0 and est["tier_counts"]["full"] == 0
    assert est["tier_counts"]["draft"] == est["drafted"] == trace.summary["drafted"]
    bounded = replace(trace, config={**trace.config, "max_unverified": 8})  # as the engine: forced rounds close tier A
    forced = viz.what_if(bounded, {"accept": 0.0, "escalate": 0.0})
    # accept 0 needs no slim pass to sort: a forced round's drafts go to the full verifier, as in the engine
    assert forced["forced_rounds"] > 0 and forced["tier_counts"]["full"] > 0 and forced["tier_counts"]["slim"] == 0
    assert est["rejection_rate"] == 0.0
    assert est["thresholds"]["signal"] == "slim"  # a dict without signal keeps the trace's
    if trace.summary["full_calls"]:  # priced by the cost profile: dropping every full pass costs less
        assert est["model_ms"] < est["recorded"]["model_ms"]
    old = viz.what_if(replace(trace, costs={}), {"accept": 0.0, "escalate": 0.0})  # no profile: phase means
    costs = old["costs"]
    assert old["model_ms"] == pytest.approx(
        trace.summary["drafted"] * costs["draft_ms_per_candidate"]
        + old["slim_calls"] * costs["slim_ms_per_call"] + len(trace.rounds) * costs["other_ms_per_round"])


def test_what_if_escalating_everything_is_plain_sd_checks(traces):
    """escalate = accept = 1 admits nothing to tiers A and B: every draft goes to the full model (plain SD), and no
    slim pass runs (the thresholds alone decide every tier)."""
    trace = traces["via"]
    est = viz.what_if(trace, {"accept": 1.0, "escalate": 1.0})
    reached = [c for c in est["candidates"] if c["decision"] != "discarded"]
    assert reached and all(c["tier"] == "full" for c in reached)
    assert est["slim_calls"] == 0 and est["tier_counts"]["slim"] == est["tier_counts"]["draft"] == 0
    assert est["tier_counts"]["full"] == est["new_tokens"] > 0


def test_what_if_on_a_hand_trace_guesses_and_says_so():
    trace = hand_trace()
    est = viz.what_if(trace, {"accept": 0.95, "escalate": 0.95})
    # round 1: "  lead" (r 0.9) now goes to the full model, which never saw it: a guess, counted
    assert est["guessed_decisions"] >= 1 and any("guessed" in n for n in est["notes"])
    assert est["changed_rounds"] >= 1


def test_what_if_rejects_non_via_traces(traces):
    with pytest.raises(ValueError, match="VIA-SD"):
        viz.what_if(traces["sd"], {"accept": 0.5, "escalate": 0.1})


def test_what_if_rejects_bad_thresholds(traces):
    with pytest.raises(ValueError):
        viz.what_if(traces["via"], {"accept": 0.1, "escalate": 0.5})


# ---- latency, speed, tier mix, positions, frontier -------------------------------------------------

def test_latency_figure_has_one_row_per_method_and_every_phase(traces):
    trs = [traces["via"], traces["sd"], traces["ar"]]
    fig = viz.latency_figure(trs)
    assert list(fig.layout.yaxis.categoryarray) == ["AR", "SD", "VIA-SD"]  # VIA-SD drawn on top
    for trace, name in zip(trs, ["VIA-SD", "SD", "AR"]):
        total = sum(x for bar in fig.data for x, y in zip(bar.x, bar.y) if y == name)
        expected = trace.summary["prefill_ms"] + sum(
            r["draft_ms"] + r["slim_ms"] + r["full_ms"] + r["other_ms"] for r in trace.rounds)
        assert total == pytest.approx(expected)
        full = next(b for b in fig.data if b.name == "full model")
        full_rounds = sum(y == name for y in full.y)
        assert full_rounds == sum(r["full_called"] and r["full_ms"] > 0 for r in trace.rounds)
    assert "ms" in fig.layout.xaxis.title.text
    # the engine reads the prompt inside round 0 (prefill_ms == 0), so no prefill bar is drawn
    assert {b.name for b in fig.data} >= {"drafter", "full model"}
    assert all(t.summary["prefill_ms"] == 0 for t in trs) and "prefill (prompt)" not in {b.name for b in fig.data}


def test_speedup_figure_from_bench_dict_and_from_traces(traces):
    fig = viz.speedup_figure({"ar": {"tokens_per_s": 10.0}, "sd": {"tokens_per_s": 20.0},
                              "via": {"tokens_per_s": 25.0}, "hf": {"tokens_per_s": 15.0}})
    tps, speed = fig.data
    assert list(tps.x) == ["AR", "SD", "VIA-SD", "HF assisted"]
    assert list(speed.y) == pytest.approx([1.0, 2.0, 2.5, 1.5])
    fig = viz.speedup_figure([traces["ar"], traces["sd"], traces["via"]])
    ar_tps = traces["ar"].summary["tokens_per_s"]
    assert list(fig.data[1].y) == pytest.approx([t.summary["tokens_per_s"] / ar_tps
                                                 for t in (traces["ar"], traces["sd"], traces["via"])])
    runs = viz.speedup_figure({"sd": {"tokens_per_s_runs": [9.0, 11.0]}, "via": [12.0, 14.0]}, baseline="sd")
    assert list(runs.data[1].y) == pytest.approx([1.0, 1.3])
    assert runs.data[0].error_y.visible


def test_tier_mix_shares_add_up(traces):
    trs = [traces["via"], traces["via_draft"], traces["sd"], traces["ar"]]
    fig = viz.tier_mix_figure(trs)
    names = viz.trace_names(trs)
    assert len(set(names)) == len(names)  # two VIA-SD traces get told apart
    for name, trace in zip(names, trs):
        shares = [x for bar in fig.data for x, y in zip(bar.x, bar.y) if y == name]
        assert sum(shares) == pytest.approx(100.0)
    via_draft = next(b for b in fig.data if b.name == P.ACCEPTED_DRAFT)
    n = sum(lab == P.ACCEPTED_DRAFT for _, lab in viz.token_spans(trs[0]))
    assert via_draft.x[0] == pytest.approx(100.0 * n / len(trs[0].tokens))


def test_acceptance_by_position(traces):
    via, sd = traces["via"], traces["sd"]
    fig = viz.acceptance_by_position_figure([via, sd, traces["ar"]])
    assert [t.name for t in fig.data] == ["VIA-SD", "SD"]  # AR drafts nothing
    gamma = via.config["gamma"]
    assert [round(x) for x in fig.data[0].x] == list(range(1, gamma + 1))
    first = [c for c in via.candidates() if c["pos"] == 0]
    kept = sum(c["decision"] in ("accepted", "kept") for c in first)
    assert fig.data[0].y[0] == pytest.approx(100.0 * kept / len(first))
    assert all(0 <= y <= 100 for t in fig.data for y in t.y)


def test_frontier_marks_points_per_signal_and_the_current_thresholds():
    sweep = [{"accept": a, "escalate": e, "signal": s, "speedup": 1 + a - e + (s == "draft") * 0.2,
              "fidelity": 0.6 + 0.4 * e} for s in ("slim", "draft") for a, e in ((0.9, 0.5), (0.6, 0.2), (0.3, 0.1))]
    sweep.append({"method": "sd", "speedup": 1.8, "fidelity": 1.0})
    fig = viz.frontier_figure(sweep, current={"accept": 0.6, "escalate": 0.2, "signal": "slim"})
    points = {t.name: t for t in fig.data if t.mode == "markers"}
    assert len(points["signal: slim"].x) == len(points["signal: draft"].x) == 3
    cur = points["current thresholds"]
    assert (cur.x[0], cur.y[0]) == pytest.approx((0.6 + 0.4 * 0.2, 1 + 0.6 - 0.2))
    assert any(t.name == "SD" for t in fig.data)
    assert _hlines(fig) == [1.0]
    assert "fidelity" in fig.layout.xaxis.title.text and "speed-up" in fig.layout.yaxis.title.text


# ---- themes, inputs, imports ---------------------------------------------------------------------

def test_every_figure_in_both_themes(traces):
    via, sd, ar = traces["via"], traces["sd"], traces["ar"]
    sweep = [{"accept": 0.6, "escalate": 0.2, "signal": "slim", "speedup": 1.5, "fidelity": 0.9}]
    for theme, template in viz.THEMES.items():
        figs = [viz.confidence_figure(via, theme=theme), viz.latency_figure([via, sd], theme=theme),
                viz.speedup_figure([ar, sd, via], theme=theme), viz.tier_mix_figure(via, theme=theme),
                viz.acceptance_by_position_figure([via, sd], theme=theme), viz.frontier_figure(sweep, theme=theme)]
        for fig in figs:  # drawn without Plotly's validation (viz.figstyle.new_figure): validated here
            data = fig.to_plotly_json()
            assert go.Figure(data).to_plotly_json() == data, "Plotly's validation accepts and keeps every key"
            assert go.layout.Template(data["layout"]["template"]) == go.layout.Template(pio.templates[template])
            assert fig.layout.title.text
    with pytest.raises(ValueError):
        viz.tier_mix_figure(via, theme="neon")


def test_trace_dicts_and_json_work_too(traces):
    via = traces["via"]
    assert viz.token_spans(via.to_dict()) == viz.token_spans(via)
    assert viz.what_if(via.to_json(), via.config["thresholds"])["tier_counts"] == via.summary["tier_counts"]


def test_viz_imports_no_model_code_and_no_gradio():
    code = "import sys, viz; bad = {'torch', 'transformers', 'gradio'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---- the page's HTML: learn view, cost panel, projection ------------------------------------------

def _learn_trace(rnd: dict, signal: str = "slim", accept: float = 0.6, escalate: float = 0.2):
    tokens = [{"i": i, "id": i, "text": f" t{i}", "round": 0, "tier": c["tier"], "outcome": "kept",
               "p_draft": 0.5, "q_slim": None, "q_full": None, "confidence": c["confidence"]}
              for i, c in enumerate(rnd["candidates"])]
    return Trace(method="via", prompt="p", tokens=tokens, rounds=[rnd],
                 config={"gamma": len(rnd["candidates"]),
                         "thresholds": {"accept": accept, "escalate": escalate, "signal": signal}})


def _learn_cand(pos, tier, r, decision="kept"):
    return {"pos": pos, "token": pos, "text": f" t{pos}", "p_draft": 0.5, "q_slim": None, "q_full": None,
            "confidence": r, "tier": tier, "decision": decision}


def test_explain_candidate_a_forced_round_sends_a_confident_draft_to_a_verifier():
    from viz.learn import explain_candidate

    rnd = {"round": 0, "forced_by": "max_unverified", "full_called": False,
           "candidates": [_learn_cand(0, "slim", 0.95), _learn_cand(1, "slim", 0.4)]}
    trace = _learn_trace(rnd)
    first = explain_candidate(rnd["candidates"][0], trace, rnd, trace.tokens)
    assert "≥ accept 0.60 would keep it unverified" in first and "no verifier" in first and "slim verifier" in first
    second = explain_candidate(rnd["candidates"][1], trace, rnd, trace.tokens)
    assert "between escalate 0.20 and accept 0.60: tier B" in second
    from viz.learn import learn_html

    assert "forced to a verifier" in learn_html(trace, 0)


def test_explain_candidate_a_tier_b_draft_the_full_model_decided():
    from viz.learn import explain_candidate

    # drafter signal: a tier-C draft at #3 makes one full pass decide from the first non-A draft on
    rnd = {"round": 0, "forced_by": None, "full_called": True,
           "candidates": [_learn_cand(0, "draft", 0.9), _learn_cand(1, "full", 0.4), _learn_cand(2, "full", 0.1), _learn_cand(3, "full", 0.5)]}
    trace = _learn_trace(rnd, signal="draft")
    why = [explain_candidate(c, trace, rnd, trace.tokens) for c in rnd["candidates"]]
    assert why[0].startswith("Drafter probability 0.90 ≥ accept 0.60: tier A")
    assert "(tier B), but draft #3 needs the full model" in why[1] and "the full model agreed" in why[1]
    assert why[2].startswith("Drafter probability 0.10 < escalate 0.20: tier C")
    assert why[3].startswith("After draft #3 escalated, the full model checks every later draft too")


def test_learn_summary_counts_a_discarded_draft_in_no_tier():
    """A draft discarded after a replacement keeps the tier it was sorted into (tier A here), but no tier decided it:
    the round's summary must not count it as kept, as the table's row shows it discarded."""
    from viz.learn import learn_html

    rnd = {"round": 0, "forced_by": None, "full_called": False, "slim_called": True, "draft_ms": 4.0, "slim_ms": 6.0,
           "candidates": [_learn_cand(0, "draft", 0.9), _learn_cand(1, "slim", 0.4, "replaced"),
                          _learn_cand(2, "draft", 0.95, "discarded")]}
    tokens = [{"i": 0, "id": 0, "text": " t0", "round": 0, "tier": "draft", "outcome": "kept", "p_draft": 0.5,
               "q_slim": None, "q_full": None, "confidence": 0.9},
              {"i": 1, "id": 9, "text": " new", "round": 0, "tier": "slim", "outcome": "replaced", "p_draft": 0.1,
               "q_slim": 0.7, "q_full": None, "confidence": 0.4}]
    trace = Trace(method="via", prompt="p", tokens=tokens, rounds=[rnd],
                  config={"gamma": 3, "thresholds": {"accept": 0.6, "escalate": 0.2, "signal": "slim"}})
    view = learn_html(trace, 0)
    summary = re.search(r'<p class="via-learn-summary">(.*?)</p>', view, re.S).group(1)
    assert "1 went to tier A (kept as drafted), 1 to tier B" in summary
    assert "0 to tier C (full model), 1 discarded (never decided)." in summary
    assert "2 token(s) were emitted" in summary
    assert view.count('data-decision="discarded"') == 1 and "Discarded: draft #2 was replaced" in view


def test_cost_panel_curve_and_projection_draw_plain_numbers():
    from viz.costs import cost_curve_figure, cost_panel_html, projection_html

    info = {"device": "CPU", "source": "measured", "gamma": 5, "alpha": 0.78, "c": 0.42, "s": 0.87, "V": 3.01,
            "E": 3.4, "ceiling": 0.69, "measured": {"sd_vs_ar": 0.68}, "predicted": {"sd_vs_ar": 0.7},
            "sentences": ["Checking 5 drafts costs 3.0 one-token passes on this CPU <b>"]}
    panel = cost_panel_html(info)
    assert 'data-kind="predicted">0.70×' in panel and 'data-kind="measured">0.68×' in panel
    assert "&lt;b&gt;" in panel and "<b>0.69×</b>" in panel, "escaped text, the formula's result in bold"
    fig = cost_curve_figure([1, 2, 3, 4, 5, 6], [1, 1.26, 1.41, 1.61, 2.66, 3.01], [0.87] * 6, 0.42, 5, theme="dark")
    assert [d.name for d in fig.data][:3] == ["k separate passes", "flat: a memory-bound GPU", "V(k) measured on "
                                                                                              "this machine"]
    shown = projection_html({"label": "an H100 GPU (roofline)", "tokens_per_s": {"via": 90.0, "ar": 40.0},
                             "speedup": {"via_vs_ar": 2.25}, "V": 1.0, "c": 0.1, "s": 0.6, "sentence": "x"})
    assert "PROJECTION" in shown and 'data-speedup="2.2500"' in shown
    assert shown.count("(projection)") == 5 and shown.count(">projection<") == 3, "every number says projection"


def test_the_cost_panel_counts_in_words_one_draft_one_round_two_tokens():
    from studio.costs import sentences
    from viz.costs import cost_panel_html
    from viz.page import plural

    assert (plural(1, "draft"), plural(3, "draft"), plural(0, "round"), plural(None, "round")) == \
        ("1 draft", "3 drafts", "0 rounds", "— rounds")
    info = {"device": "CPU", "gamma": 1, "alpha": 0.5, "c": 0.4, "s": 0.9, "V": 1.2, "best_gamma": 1,
            "tiers": {"draft": 1.0}, "full_calls": 1, "rounds": 1}
    said = " ".join(sentences(info))
    assert "Checking 1 draft (one pass over 2 tokens)" in said and "rounds of 1 draft pay" in said
    assert "in 1 of 1 round." in said and not re.search(r"\b1 (drafts|rounds|tokens)\b", said)
    panel = cost_panel_html({**info, "gamma": 0, "sentences": []})
    assert "checking 1 token V(1)" in panel and "of 1 round<" in panel
    assert not re.search(r"\b1 (drafts|rounds|tokens)\b", panel)


def test_the_cost_panel_says_what_reading_the_prompt_cost_and_what_the_opening_saved(tiny_pair):
    from studio.costs import prompt_read, sentences
    from via_sd import DecodeConfig, generate
    from via_sd.cost.model import CostProfile, call_ms

    trace = generate(tiny_pair, "hello world", "sd", DecodeConfig(gamma=2, max_new_tokens=8, chat=False))
    profile = CostProfile.from_dict(trace.costs)
    read = prompt_read(trace, profile)
    calls = [c for r in trace.rounds for c in r["calls"]]
    prompt_ms = sum(call_ms(profile, c) for c in calls if c["prompt"])
    assert read["method"] == "SD" and read["tokens"] == trace.summary["prompt_tokens"] and read["opening"] == 0
    assert read["share"] == pytest.approx(prompt_ms / sum(call_ms(profile, c) for c in calls)) and 0 < read["share"] < 1
    info = {"device": "CPU", "gamma": 2, "alpha": 0.5, "c": 0.4, "s": 0.9, "V": 1.2,
            "prompt": {"method": "SD", "tokens": 70, "opening": 24, "share": 0.31}}
    said = " ".join(sentences(info))
    assert "Reading this prompt's 46 tokens was 31% of this SD run's cost (the chat template's 24 tokens before " \
           "them are read once for all runs);" in said
    assert "template" not in " ".join(sentences({**info, "prompt": {**info["prompt"], "opening": 0}}))
