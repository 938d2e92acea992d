"""The app for a live talk, handler by handler on the random pair: drafts shown pending then decided,
race replay, threshold presets, background loading, live tuning and the provisional route.

The browser versions (what a person sees) live in test_app_browser.py.
"""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest

import app
import studio.models
import via_sd
import viz
from studio import lab, runs
from studio.models import MODELS
from via_sd import PRESETS
from via_sd.core.provisional import provisional_route
from viz.live import live_tokens_html, round_html
from viz.race import lane_of, race_end_ms, race_html
from viz.sample import sample_traces

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")
PROMPT = "Write a haiku about the sea."
NAMES = ["prompt", "preset", "gamma", "accept", "escalate", "signal", "temperature", "max_new_tokens", "seed", "route",
         "with_ar", "pace"]
ARGS = dict(zip(NAMES, (PROMPT, "random", 4, 0.5, 0.3, "slim", 0.0, 24, 0, "default", False, 0)))


def run(request=None, **named):
    return runs.run_compare(*{**ARGS, **named}.values(), request=request)


def states(pane: str) -> list[tuple[str, str, str]]:
    """(round, pos, state) of every live draft chip in a pane."""
    chips = re.findall(r'<span[^>]*class="via-live[^"]*"[^>]*>', pane)
    out = []
    for chip in chips:
        get = lambda key: (re.search(rf'{key}="([^"]*)"', chip) or [None, None])[1]  # noqa: E731
        out.append((get("data-round"), get("data-pos"), get("data-state")))
    return out


# ---- watch the drafts ----------------------------------------------------------------------------

def test_drafts_appear_pending_then_take_their_tier_color():
    outs = list(run(pace=1))  # slow motion of 1 ms: every engine event reaches the page
    seen: dict = {}
    for out in outs:
        for rnd, pos, state in states(out[0]):
            seen.setdefault((rnd, pos), []).append(state)
    both = [k for k, v in seen.items() if "pending" in v and "decided" in v[v.index("pending"):]]
    assert both, "some draft was shown pending and then in its tier color within its round"
    assert all(v.index("pending") < v.index("decided") for v in (seen[k] for k in both))
    final = outs[-1][0]
    assert not states(final), "no live chip is left once the run is recorded"
    assert final.count('class="via-tok"') == len(outs[-1][5]["via"].tokens)


def test_a_pending_chip_is_neutral_and_a_decided_one_has_its_label_color():
    cands = [{"pos": 0, "token": 5, "text": "<b>", "p_draft": 0.9, "tier": None, "decision": "pending"},
             {"pos": 1, "token": 6, "text": " x", "p_draft": 0.4, "tier": "slim", "decision": "replaced",
              "replacement_text": " y"},
             {"pos": 2, "token": 7, "text": " z", "p_draft": 0.4, "tier": "full", "decision": "discarded"}]
    html = round_html(cands, 3)
    assert 'data-state="pending"' in html and "&lt;b&gt;" in html and "<b>" not in html
    replaced = re.search(r'<span[^>]*data-decision="replaced"[^>]*>', html).group(0)
    assert "line-through" in replaced and viz.CANDIDATE_COLORS["slim verifier: regenerated"] in replaced
    assert "via-live-replacement" in html and ">\u00a0y<" in html, "the replacement stands beside the struck draft"
    assert live_tokens_html(None, cands, 3).startswith('<div class="via-sd-tokens"')


def test_a_replaced_draft_names_the_token_that_replaced_it():
    from studio.inputs import make_config
    from via_sd.core.decoding import stream_events

    pair = MODELS.pair("random")
    config = make_config(4, 1.0, 1.0, "draft", 0.0, 40, 0)  # lossless: the full model decides everything
    checked = 0
    events = list(stream_events(pair, PROMPT, "via", config))
    trace = events[-1].trace
    for event in events:
        if event.kind != "decided":
            continue
        for c in runs.with_replacements(event.candidates, pair, greedy=True):
            if c["decision"] == "replaced":
                emitted = [t for t in trace.tokens if t["round"] == event.round]
                assert c["replacement_text"] == emitted[c["pos"]]["text"] and emitted[c["pos"]]["outcome"] == "replaced"
                checked += 1
    assert checked, "the run replaced some drafts"


# ---- race replay ---------------------------------------------------------------------------------

def test_race_replay_plays_both_traces_to_the_end_in_recorded_time():
    traces = list(run())[-1][5]
    end = race_end_ms({m: traces[m] for m in ("via", "sd")})
    speed = max(end / 1500, 0.05)  # about 1.5 s of replay
    start = time.perf_counter()
    frames = list(app.views.race_replay(traces, speed))
    took = time.perf_counter() - start
    assert len(frames) >= 5 and 'data-state="playing"' in frames[0]
    assert 0.8 * end / speed / 1000 <= took <= end / speed / 1000 + 3.0, "plays in recorded time / speed"
    t = [float(re.search(r'data-t-ms="([\d.]+)"', f).group(1)) for f in frames]
    assert t == sorted(t) and t[-1] == pytest.approx(end, abs=0.1)
    final = frames[-1]
    assert 'data-state="done"' in final and "finished first" in final
    for m in ("via", "sd"):
        lane = re.search(rf'data-method="{m}" data-tokens="(\d+)" data-total="(\d+)" data-state="finished"', final)
        assert lane and int(lane.group(1)) == int(lane.group(2)) == len(traces[m].tokens)


def test_a_race_lane_spends_time_where_the_trace_did():
    traces = sample_traces(max_new_tokens=30)
    lane = lane_of(traces["via"])
    spent = {p: sum(t1 - t0 for t0, t1, ph, _ in lane.segments if ph == p) for p in ("draft", "slim", "full")}
    for p in spent:
        assert spent[p] == pytest.approx(sum(r[f"{p}_ms"] for r in traces["via"].rounds))
    assert lane.token_times == sorted(lane.token_times) and len(lane.token_times) == 30
    middle = race_html(traces, lane.end_ms / 2)
    shown = int(re.search(r'data-method="via" data-tokens="(\d+)"', middle).group(1))
    assert 0 < shown < 30


def test_race_replays_uploaded_traces(tmp_path):
    traces = sample_traces(max_new_tokens=20)
    files = []
    for m in ("via", "sd"):
        path = tmp_path / f"{m}.json"
        path.write_text(traces[m].to_json(), encoding="utf-8")
        files.append(str(path))
    state = app.views.replay_upload(files)[5]
    assert 'data-state="ready"' in app.views.race_ready(state)
    final = list(app.views.race_replay(state, 50.0))[-1]
    assert final.count('data-state="finished"') == 2 and 'data-tokens="20" data-total="20"' in final


# ---- threshold presets ---------------------------------------------------------------------------

def test_presets_set_the_controls_and_custom_leaves_them():
    for name, th in via_sd.THRESHOLD_PRESETS.items():
        assert lab.apply_threshold_preset(name) == (th.accept, th.escalate, th.signal)
    assert all(v == app.gr.skip() for v in lab.apply_threshold_preset("custom"))
    assert [v for _, v in lab.threshold_preset_choices()] == [*via_sd.THRESHOLD_PRESETS, "custom"]
    paper = via_sd.THRESHOLD_PRESETS["paper"]
    assert (app.DEFAULTS["accept"], app.DEFAULTS["escalate"], app.DEFAULTS["signal"]) == \
        (paper.accept, paper.escalate, paper.signal)


def test_what_if_places_every_preset_on_the_recorded_run():
    traces = list(run())[-1][5]
    fig = lab.what_if_presets(traces, 0.7, 0.2, "slim")
    assert isinstance(fig, go.Figure)
    points = {d.name: (d.x[0], d.y[0]) for d in fig.data if d.x is not None and len(d.x) == 1}
    assert set(via_sd.THRESHOLD_PRESETS) | {"sliders"} <= set(points)
    assert points["lossless"][0] == pytest.approx(1.0), "lossless: the full model decides every token"
    assert "ESTIMATE" in fig.layout.title.text


# ---- live tuning ---------------------------------------------------------------------------------

def test_a_release_supersedes_this_sessions_run_only():
    a, b = SimpleNamespace(session_hash="talk-a"), SimpleNamespace(session_hash="talk-b")
    run_a = run(request=a, max_new_tokens=256, pace=2)
    run_b = run(request=b, max_new_tokens=24, pace=2)
    for _ in range(4):
        next(run_a), next(run_b)
    ticket, _ = runs.request_rerun(True, a)  # session a released a slider with "re-run on release" ticked
    assert isinstance(ticket, int) and runs.request_rerun(False, a) == (app.gr.skip(), app.gr.skip())
    last_a = list(run_a)[-1]
    last_b = list(run_b)[-1]
    assert 'data-kind="stop"' in last_a[4] and "newer run" in last_a[4]
    assert len(last_a[5]["via"].tokens) < 256 and "sd" not in last_a[5]
    assert 'data-kind="ok"' in last_b[4] and len(last_b[5]["sd"].tokens) == 24, "session b ran to the end"
    newer, _ = runs.request_rerun(True, a)  # a second release while the first still waits in the queue
    stale = list(runs.rerun_on_release(True, *ARGS.values(), ticket, request=a))
    assert len(stale) == 1 and all(v == app.gr.skip() for v in stale[0]), "an older queued release never runs"
    fresh = list(runs.rerun_on_release(True, *ARGS.values(), newer, request=a))
    assert 'data-kind="ok"' in fresh[-1][4]


# ---- background loading --------------------------------------------------------------------------

def test_a_run_during_the_background_load_waits_with_progress(monkeypatch):
    MODELS.free()
    real = studio.models.load_pair
    gate = threading.Event()

    def slow_load(preset, progress=None, **kw):
        for k in range(1, 5):
            progress(f"step {k} of 4", k / 5)
            if k == 2:
                gate.wait(60)  # held here until the test has read the status
            else:
                time.sleep(0.3)
        return real(preset, progress=progress, **kw)

    monkeypatch.setattr(studio.models, "load_pair", slow_load)
    MODELS.preload("random")
    deadline = time.time() + 60  # a busy machine may start the load's thread late
    while '<progress value="0.' not in MODELS.status("random") and time.time() < deadline:
        time.sleep(0.02)
    assert '<progress value="0.' in MODELS.status("random") and "step" in MODELS.status("random")
    threading.Timer(0.5, gate.set).start()  # the load goes on while the run below waits for it
    seen = []
    pair = MODELS.wait("random", progress=lambda f, desc="": seen.append((f, desc)))
    assert pair is MODELS.loaded("random")
    assert seen and all("waiting for random" in d for _, d in seen), "the run's progress bar follows the load"
    assert "float32" in MODELS.status("random")


def test_the_warm_up_is_a_gpu_call_made_once_per_pair(monkeypatch):
    calls = []
    monkeypatch.setattr(studio.models, "warm_up", lambda pair, stop=None: calls.append(pair))
    MODELS.free()
    pair = MODELS.pair("random", warm=False)  # as on ZeroGPU: loaded in the background, not warmed there
    assert calls == []
    list(run())  # the first run warms up inside its own (GPU) call
    list(run())
    assert calls == [pair]


# ---- hub presets: a provisional route at once, a better one on request ----------------------------

def test_a_preset_without_a_route_starts_provisional_and_searches_a_better_one(monkeypatch, tmp_path):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path))
    monkeypatch.setitem(PRESETS, "random-unrouted", {**PRESETS["random"], "route": None})
    real = studio.models.load_pair

    def load_like_a_hub_preset(preset, **kw):  # load_pair gives hub presets without a route the provisional
        pair = real(preset, **kw)                 # rule; its random: shortcut skips that step, so do it here
        pair.set_route(provisional_route(pair.verifier.config.num_hidden_layers))
        return pair

    monkeypatch.setattr(studio.models, "load_pair", load_like_a_hub_preset)
    searched = []

    def search(pair, progress=None, stop=None):  # the engine's search has its own tests: the app's part here
        searched.append((pair, stop))
        return via_sd.Route("random-s25", ("attn.1", "mlp.2"), pair.verifier.config.num_hidden_layers,
                            {"method": "searched", "search": {"objective": "agreement", "evaluations": 3}})

    monkeypatch.setattr(lab, "route_for", search)
    try:
        shared = MODELS.pair("random-unrouted")
        assert "provisional" in MODELS.status("random-unrouted")
        assert lab.route_search_row("random-unrouted").visible is True
        view = MODELS.view(shared, "random-unrouted", "default")
        assert view.route.meta.get("provisional"), "the preset default keeps the route picked at load"
        device, status, row = lab.search_better_route("random-unrouted", progress=lambda *a, **k: None)
        assert 'data-kind="ok"' in status and "searched" in status.lower(), status
        assert not MODELS.default_route("random-unrouted").meta.get("provisional") and row.visible is False
        assert shared.route.meta.get("provisional"), "the shared pair itself never changes"
        assert MODELS.view(shared, "random-unrouted", "default").route.skip == ("attn.1", "mlp.2")
        (pair, stop), = searched
        assert pair is not shared and not stop.is_set(), "the search ran on its own view, with a stop switch"
    finally:
        MODELS.free()
