"""The Gradio app: handlers (studio/) called directly as plain functions, then a live server driven by
gradio_client.

Everything runs on the "random" preset (the tiny random pair, real decoding in milliseconds); the
browser end-to-end tests live in test_app_browser.py.
"""

from __future__ import annotations

import json
import re
import time
import weakref
from types import SimpleNamespace

import gradio as gr
import plotly.graph_objects as go
import pytest

import app
import viz
import viz.page as page
from studio import lab, runs, views
from studio.gpu import MAX_RUN_S, gpu, run_seconds
from studio.inputs import MAX_PROMPT_CHARS
from studio.models import MODELS, load_preset, poll_status, preset_choices
from studio.sessions import SESSIONS
from via_sd import PRESETS, Trace

# gr.Warning outside a request only calls warnings.warn; the page shows the same text in the status box
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")
PROMPT = "Write a haiku about the sea."
# prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar
RUN_ARGS = (PROMPT, "random", 4, 0.6, 0.2, "slim", 0.0, 32, 0, "default", False)


def run(*overrides, **named):
    """All outputs of one run_compare call; `named` overrides arguments by name."""
    args = dict(zip(["prompt", "preset", "gamma", "accept", "escalate", "signal", "temperature", "max_new_tokens",
                     "seed", "route", "with_ar"], RUN_ARGS))
    args.update(named)
    return list(runs.run_compare(*args.values()))


def tokens_in(pane_html: str) -> int:
    return pane_html.count('class="via-tok"')


@pytest.fixture(scope="module")
def last_run():
    """One finished run with AR, then its fidelity step: (all yielded outputs, the run record)."""
    outs = run(with_ar=True)
    metrics, record = runs.fidelity_after_run(outs[-1][5])
    return outs + [(*outs[-1][:3], metrics, outs[-1][4], record)], record


# ---- run: streaming, metrics, stop ---------------------------------------------------------------

def test_run_streams_via_first_then_sd_then_ar(last_run):
    outs, traces = last_run
    via_counts = [tokens_in(o[0]) for o in outs]
    sd_counts = [tokens_in(o[1]) for o in outs]
    ar_counts = [tokens_in(o[2]) for o in outs]
    first_sd = next(i for i, n in enumerate(sd_counts) if n)
    first_ar = next(i for i, n in enumerate(ar_counts) if n)
    assert via_counts[first_sd] == 32, "VIA-SD finishes before plain SD starts (one after the other)"
    assert sd_counts[first_ar] == 32
    assert len(outs) > 3 and ('data-state="pending"' in outs[1][0] or 0 < via_counts[1] < 32), \
        "the VIA-SD pane fills as rounds are decided (its first drafts show at once, pending)"
    assert set(traces) >= {"via", "sd", "ar", "ticket", "preset", "fidelity"}
    assert [traces[m].method for m in ("via", "sd", "ar")] == ["via", "sd", "ar"]
    assert 'data-kind="ok"' in outs[-1][4]


def test_panes_color_tokens_by_tier_with_hover_details(last_run):
    _, traces = last_run
    via = page.pane_html(traces["via"], "via")
    labels = set(re.findall(r'data-label="([^"]+)"', via))
    assert labels and labels <= set(viz.TIER_COLORS)
    assert "title=" in via and "confidence r" in via  # the hover tooltip
    assert tokens_in(via) == len(traces["via"].tokens)


def test_metric_cards_show_speed_ups_vs_ar_and_sd_side_by_side_rates_calls_and_fidelity(last_run):
    _, traces = last_run
    html = page.metrics_html(runs.runs_of(traces), traces["fidelity"])
    for key in ("tokens_per_s", "speedup_ar", "speedup_sd", "rejection_rate", "mean_accepted_length", "full_calls",
                "fidelity"):
        assert f'data-metric="{key}"' in html
    via, sd, ar = (traces[m].summary["tokens_per_s"] for m in ("via", "sd", "ar"))
    assert f"{via / sd:.2f}×" in html and f"{via / ar:.2f}×" in html and f"{sd / ar:.2f}×" in html
    cards = re.findall(r'data-metric="([a-z_]+)"', html)
    assert cards.index("speedup_sd") == cards.index("speedup_ar") + 1, "vs AR and vs SD stand side by side"
    assert traces["fidelity"]["sd"]["agreement"] == 1.0, "greedy plain SD is lossless"
    assert f'{traces["fidelity"]["via"]["agreement"]:.1%}' in html


def test_stop_ends_the_run_between_rounds_and_skips_the_rest():
    outs = []
    for out in runs.run_compare(PROMPT, "random", 4, 0.6, 0.2, "slim", 0.0, 1024, 0, "default", True):
        outs.append(out)
        if len(outs) == 2:  # the VIA-SD pane shows its first drafts
            runs.stop_work(None)  # what the Stop button calls, in this (local) session
    traces = outs[-1][5]
    assert traces["via"].summary["stopped"] is True
    assert len(traces["via"].tokens) < 1024
    assert "sd" not in traces and "ar" not in traces
    assert 'data-kind="stop"' in outs[-1][4]


def test_releasing_a_slider_re_runs_only_when_asked():
    skipped = list(runs.rerun_on_release(False, *RUN_ARGS))
    assert len(skipped) == 1 and all(v == app.gr.skip() for v in skipped[0])
    outs = list(runs.rerun_on_release(True, *RUN_ARGS))
    assert tokens_in(outs[-1][0]) == 32 and 'data-kind="ok"' in outs[-1][4]


# ---- bad input: a clear message in the page, no exception -----------------------------------------

@pytest.mark.parametrize("named, message", [
    ({"prompt": "   "}, "The prompt is empty"),
    ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "the limit here is"),
    ({"accept": 0.2, "escalate": 0.7}, "thresholds out of order"),
    ({"preset": "tiny"}, "HF_HUB_OFFLINE"),
    ({"route": "embedded-default"}, "does not fit this verifier"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_input_shows_a_message_not_a_stack_trace(named, message, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    outs = run(**named)
    status = outs[-1][4]
    assert 'data-kind="error"' in status and message in status
    assert "Traceback" not in status
    assert not runs.runs_of(outs[-1][5])


def test_a_model_that_cannot_load_gives_a_message_and_frees_the_old_pair(monkeypatch):
    monkeypatch.setitem(PRESETS, "broken", {"drafter": "/nonexistent/drafter.gguf",
                                            "verifier": "/nonexistent/verifier.gguf", "route": None,
                                            "about": "a pair whose files are missing"})
    old = weakref.ref(MODELS.pair("random"))
    assert MODELS.pair("random") is old(), "one loaded pair, shared"
    device, status = load_preset("broken")
    assert 'data-kind="error"' in status and "could not load preset &#x27;broken&#x27;" in status
    assert "does not exist" in status
    assert old() is None, "switching preset freed the old pair first"
    assert "⚠" in device
    assert MODELS.pair("random") is not None


def test_a_status_tick_sent_before_a_switch_leaves_the_new_pairs_line_alone():
    """The page's timer polls the device line with the preset it showed when the tick left. A tick still asking
    about the old preset once another pair is loaded wrote the old pair's line over the new one's and stopped the
    timer, and the page showed the wrong pair for good (a browser test caught it in a busy suite)."""
    MODELS.pair("random")
    device, timer = poll_status("tiny")  # the page's old preset: not loaded, not loading; "random" is loaded
    assert device == gr.skip() and timer.active is False
    device, timer = poll_status("random")
    assert "float32" in device and timer.active is False


def test_hub_presets_are_marked_when_the_hub_is_off(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    labels = dict((v, k) for k, v in preset_choices())
    assert "[needs the hub]" in labels["gpu"] and "[needs the hub]" not in labels["embedded"]
    assert "cpu" in MODELS.status("random") and "float32" in MODELS.status("random")


def test_the_device_line_names_the_low_bit_kernel():
    from viz import page
    from via_sd.weights.linears import kernel_rule

    line = page.pair_line("cpu", "float32", "int4", "d", "v", "r", 0, 0.0, False, kernel_rule().split(" (")[0])
    assert "int4 weights (via_sd q8-activation int4/int8 kernel and fixed-order attention, " in line \
        or "int4 weights (torch's int4/int8" in line


# ---- views of the recorded traces -----------------------------------------------------------------

def test_views_draw_every_plot_and_reset_the_learn_slider(last_run):
    _, traces = last_run
    out = views.views(traces, "dark")
    figures = out[:5]
    assert all(isinstance(f, go.Figure) and f.data for f in figures)
    light = views.views(traces, "light")[0]
    assert figures[0].layout.template.layout.paper_bgcolor != light.layout.template.layout.paper_bgcolor
    assert out[5].maximum == len(traces["via"].rounds)
    assert 'data-round="0"' in out[6]


def test_what_if_is_an_estimate_that_follows_the_thresholds(last_run):
    _, traces = last_run
    recorded, fig = lab.what_if_view(traces, 0.6, 0.2, "slim")
    assert "ESTIMATE" in recorded and 'data-accept="0.60"' in recorded and fig.data
    strict, _ = lab.what_if_view(traces, 1.0, 1.0, "slim")  # everything escalates to the full model
    cells = re.findall(r"<tr><td>tokens from tier C \(full model\)</td><td><b>(\d+)</b></td><td>(\d+)</td>", strict)
    assert cells and int(cells[0][0]) >= int(cells[0][1])
    assert strict != recorded
    bad, fig = lab.what_if_view(traces, 0.1, 0.9, "slim")
    assert "out of order" in bad and fig is None
    empty, _ = lab.what_if_view({}, 0.6, 0.2, "slim")
    assert 'data-state="empty"' in empty


def test_learn_explains_every_candidate_of_a_round(last_run):
    _, traces = last_run
    trace = traces["via"]
    for k, rnd in enumerate(trace.rounds, start=1):
        view = views.learn_view(traces, k)
        assert f"round {k} of {len(trace.rounds)}" in view
        whys = re.findall(r'<td class="via-why">(.*?)</td>', view)
        assert len(whys) == len(rnd["candidates"])
        for cand, why in zip(rnd["candidates"], whys):
            if cand["decision"] == "accepted":
                assert "≥ accept 0.60: tier A" in why
            elif cand["decision"] == "discarded":
                assert why.startswith(("Discarded", "Not used"))
            elif cand["tier"] == "slim":
                assert "tier B, the slim verifier" in why
    assert views.step_round(1, -1, traces) == 1
    assert views.step_round(len(trace.rounds), 1, traces) == len(trace.rounds)
    assert 'data-state="empty"' in views.learn_view({}, 1)


def test_trace_table_and_downloads_round_trip(last_run):
    _, traces = last_run
    table, json_path, csv_path = views.trace_table(traces, "via")
    assert len(table) == len(traces["via"].tokens)
    with open(json_path, encoding="utf-8") as f:
        assert Trace.from_json(f.read()) == traces["via"]
    with open(csv_path, encoding="utf-8") as f:
        assert f.readline().startswith("i,id,text,round,tier")
    assert views.trace_table({}, "via")[1] is None


def test_upload_replays_a_trace_without_any_model(last_run, tmp_path):
    _, traces = last_run
    path = tmp_path / "sd.json"
    path.write_text(traces["sd"].to_json(), encoding="utf-8")
    via_pane, sd_pane, ar_pane, metrics, status, state = views.replay_upload([str(path)])
    assert tokens_in(sd_pane) == len(traces["sd"].tokens) and tokens_in(via_pane) == 0
    assert 'data-kind="ok"' in status and state["sd"] == traces["sd"]
    figures = views.views(state, "light")
    assert all(isinstance(f, go.Figure) for f in figures[:5])


@pytest.mark.parametrize("content, message", [
    (b'{"hello": 1}', "not a VIA-SD trace"),
    (b"not json at all", "is not JSON"),
    (b"\xff\xfe\x00binary", "is not a text file"),
    (b'{"schema": "via-sd-trace/1", "method": "via", "prompt": "", "tokens": [{"x": 1}], "rounds": [], '
     b'"summary": {}}', "not a VIA-SD trace"),
])
def test_a_file_that_is_not_a_trace_gives_a_clear_message(content, message, tmp_path):
    path = tmp_path / "upload.json"
    path.write_bytes(content)
    out = views.replay_upload([str(path)])
    assert 'data-kind="error"' in out[4] and message in out[4]


def test_sweep_measures_a_frontier_and_rejects_bad_grids():
    fig, status = lab.measure_sweep(PROMPT, "random", 4, "slim", 0.0, 8, 0, "default", "0.5, 0.9", "0.0",
                                    0.5, 0.0)
    assert 'data-kind="ok"' in status and isinstance(fig, go.Figure)
    names = [d.name for d in fig.data]
    assert "signal: slim" in names and "plain SD" in names
    with pytest.raises(gr.Error, match="accept values: write numbers between 0 and 1"):  # refused, naming the field
        lab.measure_sweep(PROMPT, "random", 4, "slim", 0.0, 12, 0, "default", "high", "0.0", 0.5, 0.0)


def test_examples_cover_every_task_and_gpu_is_a_no_op_here_with_a_duration_for_the_longest_run():
    examples, labels = app.example_prompts()
    assert len(examples) == len(labels) >= 10
    assert {label.split(":")[0] for label in labels} >= {"summarization", "translation", "qa", "math", "code"}

    def f():
        return 1

    assert gpu(60)(f) is f  # the `spaces` package is not installed here
    assert run_seconds(512) == MAX_RUN_S >= 200 > run_seconds(64) > 30, "the longest run fits, a short one asks less"
    longest = list(RUN_ARGS)
    longest[7], longest[10] = 512, True
    assert runs.run_duration(*longest, 0, None, request=None, progress=None) == MAX_RUN_S
    assert runs.run_duration(*RUN_ARGS) < run_seconds(32), "without AR a run asks for less"


# ---- a live server driven by gradio_client ---------------------------------------------------------

@pytest.fixture(scope="module")
def server(serve_random_app):
    return serve_random_app()


def test_client_runs_streams_and_downloads(server, tmp_path):
    from gradio_client import Client, handle_file

    client = Client(server, download_files=str(tmp_path), verbose=False)
    job = client.submit(*RUN_ARGS, api_name="/run")
    while not job.done():
        time.sleep(0.05)
    outputs = job.outputs()
    assert len(outputs) > 2, "the run streams several updates"
    via_pane, sd_pane, _, metrics, status = outputs[-1]
    assert tokens_in(via_pane) == 32 and tokens_in(sd_pane) == 32
    assert 'data-metric="fidelity"' in metrics and 'data-kind="ok"' in status

    table, json_file, csv_file = client.predict("via", api_name="/trace_files")  # this session's traces
    with open(json_file, encoding="utf-8") as f:
        trace = Trace.from_json(f.read())
    assert trace.method == "via" and len(trace.tokens) == 32
    assert len(table["data"]) == 32 and open(csv_file, encoding="utf-8").readline().startswith("i,id")

    other = Client(server, download_files=str(tmp_path / "other"), verbose=False)
    theirs = other.predict("via", api_name="/trace_files")[1]  # a new session holds the recorded opening run
    with open(theirs, encoding="utf-8") as f:
        assert Trace.from_json(f.read()).prompt != trace.prompt, "another session sees none of this one's run"

    replay = other.predict([handle_file(json_file)], api_name="/replay")
    assert tokens_in(replay[0]) == 32 and 'data-kind="ok"' in replay[4]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a trace"}))
    assert "not a VIA-SD trace" in other.predict([handle_file(str(bad))], api_name="/replay")[4]


def test_client_stop_stops_a_long_run(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    args = list(RUN_ARGS)
    args[7] = 512  # the slider's maximum: VIA-SD then SD take long enough for Stop to arrive midway
    job = client.submit(*args, api_name="/run")
    deadline = time.time() + 60
    while time.time() < deadline and not any(tokens_in(o[0]) for o in job.outputs()):
        time.sleep(0.05)
    client.predict(api_name="/stop")
    while not job.done():
        time.sleep(0.05)
    via_pane, sd_pane, _, _, status = job.outputs()[-1]
    assert 'data-kind="stop"' in status
    assert tokens_in(via_pane) + tokens_in(sd_pane) < 2 * 512


# ---- one cancellation scheme: tickets per session ---------------------------------------------------

def session(name: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=name)


def test_stop_while_queued_stops_that_run_before_it_starts_and_no_other_session():
    a, b = session("queued-a"), session("queued-b")
    ticket_a, *_ = runs.take_run_ticket("light", a)  # Run pressed: the ticket is taken before the queue
    ticket_b, *_ = runs.take_run_ticket("light", b)
    runs.stop_work(a)  # Stop pressed while a's run waits in the queue
    outs_a = list(runs.run_compare(*RUN_ARGS, ticket=ticket_a, request=a))
    assert len(outs_a) == 1 and "Stopped before it started" in outs_a[0][4]
    outs_b = list(runs.run_compare(*RUN_ARGS, ticket=ticket_b, request=b))
    assert 'data-kind="ok"' in outs_b[-1][4] and tokens_in(outs_b[-1][1]) == 32


def test_a_newer_run_of_the_session_supersedes_the_running_one():
    a = session("newer-a")
    first = runs.run_compare(*RUN_ARGS[:7], 512, *RUN_ARGS[8:], request=a)
    next(first), next(first)
    ticket, *_ = runs.take_run_ticket("light", a)  # Run pressed again while the first runs
    last = list(first)[-1]
    assert 'data-kind="stop"' in last[4] and "newer run" in last[4]
    assert len(last[5]["via"].tokens) < 512 and "sd" not in last[5]
    assert not runs.is_current(last[5], a), "its figures and fidelity are skipped"
    assert runs.fidelity_after_run(last[5], a) == (app.gr.skip(), app.gr.skip())
    assert all(v == app.gr.skip() for v in views.views(last[5], "light", a))
    fresh = list(runs.run_compare(*RUN_ARGS, ticket=ticket, request=a))
    assert 'data-kind="ok"' in fresh[-1][4] and runs.is_current(fresh[-1][5], a)


def test_a_run_pressed_after_done_ends_the_last_runs_follow_up_chain_at_settle():
    a = session("settle-a")
    done = list(runs.run_compare(*RUN_ARGS, request=a))[-1][5]
    assert runs.settle(done, None) is done, "an upload or a script: handed on at once"
    runs.take_run_ticket("light", a)  # Run pressed again within the pause
    started = time.perf_counter()
    with pytest.raises(app.gr.Error) as superseded:
        runs.settle(done, a)
    assert time.perf_counter() - started < 0.5, "the pause ends as soon as the newer run is asked for"
    assert not superseded.value.visible, "silent: it only stops the steps that follow (.success)"
    b = session("settle-b")
    latest = list(runs.run_compare(*RUN_ARGS, request=b))[-1][5]
    assert runs.settle(latest, b) is latest, "the session's latest run: its record goes on to the steps"


def test_stop_ends_a_sweep_and_a_route_search_of_that_session_only(monkeypatch):
    a, b = session("sweep-a"), session("sweep-b")
    ticket, _ = lab.take_sweep_ticket("light", a)
    runs.stop_work(a)  # while queued
    _, status = lab.measure_sweep(PROMPT, "random", 4, "slim", 0.0, 12, 0, "default", "0.5, 0.9", "0.0", 0.5, 0.0,
                                  ticket=ticket, request=a)
    assert "stopped before it started" in status
    seen = {}

    def fake_run_sweep(pair, prompts, config, stop=None, **kw):  # Stop pressed by a while b's sweep runs
        runs.stop_work(a)
        seen["b stopped"] = stop.is_set()
        return {"points": [], "sd": None, "stopped": stop.is_set()}

    monkeypatch.setattr(lab, "run_sweep", fake_run_sweep)
    lab.measure_sweep(PROMPT, "random", 4, "slim", 0.0, 12, 0, "default", "0.5", "0.0", 0.5, 0.0, request=b)
    assert seen == {"b stopped": False}, "a's Stop never reaches b's sweep"
    job = SESSIONS.get(a).job("route", lab.take_route_ticket(a))  # a route search, running
    other = SESSIONS.get(b).job("route", lab.take_route_ticket(b))
    assert not job.is_set()
    runs.stop_work(a)
    assert job.is_set() and job.stopped and not other.is_set()


def test_two_sessions_running_different_routes_at_once_get_the_routes_they_asked_for(monkeypatch):
    """Interleaved round by round, as two queued runs of a server with more workers would be."""
    monkeypatch.setitem(PRESETS, "random-routed", {**PRESETS["random"], "route": "none"})
    a, b = session("route-a"), session("route-b")
    routes = {"a": ["attn.1", "mlp.2"], "b": "none"}
    monkeypatch.setattr(MODELS, "default_route", lambda preset: None)
    shared = MODELS.pair("random")
    gen_a = runs.run_compare(*RUN_ARGS[:9], routes["a"], False, request=a)
    gen_b = runs.run_compare(*RUN_ARGS[:9], routes["b"], False, request=b)
    outs_a, outs_b = [], []
    for out_a, out_b in zip(gen_a, gen_b):
        outs_a.append(out_a)
        outs_b.append(out_b)
    outs_a += list(gen_a)
    outs_b += list(gen_b)
    va, vb = outs_a[-1][5]["via"], outs_b[-1][5]["via"]
    assert va.models["skipped"] == ["attn.1", "mlp.2"] and vb.models["skipped"] == []
    assert shared.route.name == PRESETS["random"]["route"] == "none", "the shared pair was never changed"


def test_a_run_works_on_its_own_view_of_the_pair():
    shared = MODELS.pair("random")
    view = MODELS.view(shared, "random", ["attn.1"])
    assert view is not shared and view.verifier is shared.verifier and view.slim is not shared.slim
    assert view.route.skip == ("attn.1",) and shared.route.name == "none"


# ---- why this speed, and where it would pay -----------------------------------------------------------

def test_the_cost_panel_explains_the_run_with_the_engines_profile(last_run):
    from studio import costs

    _, traces = last_run
    panel = costs.panel(traces)
    assert 'data-state="ready"' in panel and "one-token passes" in panel
    assert re.search(r'data-pair="via_vs_ar"><th>[^<]+</th><td data-kind="predicted">[\d.]+×</td>'
                     r'<td data-kind="measured">[\d.]+×</td>', panel), "predicted beside measured"
    fig = costs.curve(traces)
    assert any(d.name.startswith("V(k) measured") for d in fig.data)
    assert 'data-state="empty"' in costs.panel({})


def test_a_projection_control_changes_the_projected_speed_up_and_says_projection(last_run):
    from studio import costs

    _, traces = last_run
    as_measured = costs.projection(traces, costs.MEASURED, 0.0, None, None)
    flat = costs.projection(traces, costs.MEASURED, 1.0, None, None)
    speed = lambda h: float(re.search(r'data-speedup="([\d.]+)"', h).group(1))  # noqa: E731
    assert speed(flat) != speed(as_measured)
    numbers = re.findall(r'<div class="via-card-value">[\d.]+×</div><div class="via-card-note">([^<]+)<', flat)
    assert numbers and all(n == "projection" for n in numbers), "every projected speed-up says projection"
    gpu_view = costs.projection(traces, "H100", 0.0, None, None)
    assert "H100" in gpu_view and "projection" in gpu_view
    flatness, c, s = costs.profile_controls(traces, "H100")
    assert flatness == 0.0 and 0 < c < 1 and 0 < s <= 1


def test_an_api_run_has_no_ticket_step_so_a_stop_nobody_claimed_ends_it_before_it_starts(monkeypatch):
    api, page_session = session("api-client"), session("api-other")
    # the client's /stop while its /run waits in Gradio's queue (no run of it is running; a direct call has no queue)
    monkeypatch.setattr(runs, "model_work_queued", lambda request: True)
    runs.stop_work(api)
    outs = list(runs.run_compare(*RUN_ARGS, request=api))
    assert len(outs) == 1 and "Stopped before it started" in outs[0][4]
    again = list(runs.run_compare(*RUN_ARGS, request=api))  # that Stop was used up: the next run runs
    assert 'data-kind="ok"' in again[-1][4]
    running = runs.run_compare(*RUN_ARGS[:7], 512, *RUN_ARGS[8:], request=page_session)
    next(running), next(running)
    runs.stop_work(page_session)  # a Stop that the running run takes up ...
    assert 'data-kind="stop"' in list(running)[-1][4]
    assert 'data-kind="ok"' in list(runs.run_compare(*RUN_ARGS, request=page_session))[-1][4], \
        "... is not left over for the session's next run"
