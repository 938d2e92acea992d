"""A shared trace is untrusted input; a public Space is many users (issue 13).

Every trace here is made by real decoding on the tiny random pair at test time, so fields the engine
adds later are covered without touching this file. The hostile-trace test mutates each field of
those traces in turn (HTML payloads, NaN / Infinity, negatives, wrong types, deep nesting, huge
strings): each upload is refused with a message naming the field, or rendered with the payload
escaped. The browser test checks that no payload runs in a real page.

The handlers live in `studio/` (runs, views, lab, models, downloads, sessions); `app.py` keeps the page's
layout and wiring (`build_demo`, `load_preset`, `forget_session`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

import app
import studio.downloads
from studio import lab, runs, views
from studio.downloads import DOWNLOADS
from studio.models import MODELS
from via_sd import DecodeConfig, Thresholds, Trace, generate
from via_sd.core.trace_check import MAX_DEPTH, TraceError, check_trace, json_depth, load_trace_json
from viz import what_if

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a haiku about the sea."
# prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar
RUN_ARGS = (PROMPT, "random", 4, 0.6, 0.2, "slim", 0.0, 12, 0, "default", False)
XSS = ['<img src=x onerror="window.__xss=1">', '"><svg onload=window.__xss=1>',
       "</td></tr></table><script>window.__xss=1</script>", "' onmouseover='window.__xss=1' x='"]


@pytest.fixture(scope="module")
def traces(tiny_routed_pair):
    """Real traces of every method and signal, greedy and sampled."""
    out = {}
    for name, method, signal, temperature in [("via", "via", "slim", 0.0), ("via-draft", "via", "draft", 0.7),
                                              ("sd", "sd", "slim", 0.0), ("ar", "ar", "slim", 0.0)]:
        cfg = DecodeConfig(gamma=3, max_new_tokens=8, temperature=temperature, seed=1,
                           thresholds=Thresholds(accept=0.6, escalate=0.2, signal=signal))
        out[name] = generate(tiny_routed_pair, PROMPT, method, cfg)
    return out


def request(session: str):
    """What Gradio hands a handler: its session (tickets and download folders are kept per session hash)."""
    return SimpleNamespace(session_hash=session)


def upload(tmp_path: Path, data, name="trace.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return views.replay_upload([str(path)])


# ---- the gate: every field of real traces ---------------------------------------------------------

def fields(data, path=""):
    """(path, value) of every string / number / bool / null leaf, one per distinct field (first index)."""
    seen = set()

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}" if path else k)
        elif isinstance(node, list):
            for n, v in enumerate(node):
                yield from walk(v, f"{path}[{n}]")
        else:
            shape = re.sub(r"\[\d+\]", "[]", path)
            if shape not in seen:
                seen.add(shape)
                yield path, node

    yield from walk(data, path)


def set_field(data, path, value):
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    node = data
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value


def nested(depth: int):
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def mutations(value):
    """Hostile replacements for one field's value."""
    out = [("html", "".join(XSS))]  # every payload at once: any one of them that ran would show
    out += [("deep", nested(MAX_DEPTH + 8)), ("object", {"x": 1}), ("list", [1, 2])]
    if isinstance(value, str):
        out += [("huge", "x" * 2_100_000), ("number", 7)]
    else:
        out += [("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")), ("negative", -3),
                ("huge int", 10**30), ("string", "12")]
    return out


# every field the schema documents (DESIGN.md, via_sd/core/trace.py), "[]" for any index
DOCUMENTED = {
    "schema", "method", "prompt", "text", "token_ids[]", "device", "dtype", "models.drafter", "models.verifier",
    "models.route", "models.skipped[]", "models.skip_fraction", "config.gamma", "config.max_new_tokens",
    "config.temperature", "config.top_p", "config.seed", "config.thresholds.accept", "config.thresholds.escalate",
    "config.thresholds.signal",
    *(f"tokens[].{k}" for k in ("i", "id", "text", "round", "tier", "outcome", "p_draft", "q_slim", "q_full",
                                "confidence")),
    *(f"rounds[].{k}" for k in ("round", "start_ms", "draft_ms", "slim_ms", "full_ms", "other_ms", "full_called",
                                "slim_called")),
    *(f"rounds[].candidates[].{k}" for k in ("pos", "token", "text", "p_draft", "q_slim", "q_full", "slim_top",
                                             "full_top", "confidence", "tier", "decision")),
    *(f"summary.{k}" for k in ("new_tokens", "prefill_ms", "wall_ms", "tokens_per_s", "mean_accepted_length",
                               "rejection_rate", "drafted", "full_calls", "full_calls_per_token", "slim_calls",
                               "tier_counts.draft", "tier_counts.slim", "tier_counts.full")),
}
# documented fields that hold free text: an HTML payload there is shown as text
FREE_TEXT = {"prompt", "text", "device", "dtype", "models.drafter", "models.verifier", "models.route",
             "models.skipped[]", "tokens[].text", "rounds[].candidates[].text"}


def parsed(page: str) -> tuple[set, set]:
    """(tag names, event-handler attributes) a browser would build from `page`."""
    from html.parser import HTMLParser

    tags, handlers = set(), set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.add(tag)
            handlers.update(name for name, _ in attrs if name.startswith("on"))

    Collect().feed(page)
    return tags, handlers


def html_outputs(out) -> str:
    """Every HTML string a replay puts in the page: panes, metrics and status, the learn view of every round,
    the what-if card."""
    state = out[5] if isinstance(out[5], dict) else {}
    pages = [o for o in out[:5] if isinstance(o, str)]
    main = views.learn_trace(state)
    for k in range(1, len(main.rounds) + 1 if main else 2):
        pages.append(views.learn_view(state, k))
    pages.append(lab.what_if_card(state, 0.5, 0.1, "slim"))
    return "".join(pages)


@pytest.mark.parametrize("name", ["via", "via-draft", "sd", "ar"])
def test_every_field_of_a_real_trace_passes_the_gate_and_round_trips(traces, name):
    trace = traces[name]
    assert Trace.from_json(trace.to_json()) == trace
    check_trace(trace.to_dict())
    assert len(list(fields(trace.to_dict()))) > 30


@pytest.mark.parametrize("name", ["via"])  # an SD or AR trace has the same fields or a subset of them
def test_a_hostile_trace_is_refused_naming_the_field_or_rendered_escaped(traces, name, tmp_path):
    """Each field of a real trace in turn: HTML, NaN / Infinity, negatives, wrong types, deep nesting, huge."""
    base = traces[name].to_dict()
    refused = rendered = 0
    for path, value in fields(base):
        shape = re.sub(r"\[\d+\]", "[]", path)
        for kind, bad in mutations(value):
            data = json.loads(json.dumps(base))
            set_field(data, path, bad)
            out = upload(tmp_path, json.dumps(data))
            status = out[4]
            if 'data-kind="error"' in status:
                refused += 1
                shown = re.sub(r"\[\d+\]", "[]", status)
                assert re.sub(r"\[\d+\]", "[]", path) in shown, f"{path} <- {kind}: the message names the field"
                assert "not a VIA-SD trace" in status and "Traceback" not in status
            else:
                rendered += 1
                assert 'data-kind="ok"' in status, f"{path} <- {kind}: {status}"
                assert kind not in ("nan", "inf", "-inf", "huge int", "huge", "deep"), f"{path} <- {kind}: accepted"
                assert shape not in DOCUMENTED or (shape in FREE_TEXT and kind.startswith("html")), \
                    f"{path} <- {kind}: a documented field accepted {bad!r}"
                tags, handlers = parsed(html_outputs(out))
                assert not tags & {"img", "svg", "script"} and not handlers, f"{path} <- {kind}: rendered unescaped"
    assert refused > 100 and rendered > 5  # both outcomes happen, so neither branch is dead


def test_unknown_fields_are_accepted_within_bounds_and_named_when_not(traces):
    data = traces["via"].to_dict()
    data["summary"]["a_future_share"] = 0.25
    data["rounds"][0]["a_future_reason"] = "tier C draft at position 2"
    check_trace(data)  # a newer engine's extra fields replay
    for key, bad, words in [("a_future_share", 1.5, "in [0, 1]"), ("a_future_ms", -2.0, ">= 0"),
                            ("a_future_value", float("nan"), "finite"), ("a_future_text", "y" * 5000, "characters")]:
        data = traces["via"].to_dict()
        data["summary"][key] = bad
        with pytest.raises(TraceError, match=re.escape(f"summary.{key}")) as err:
            check_trace(data)
        assert words in str(err.value)


def test_pending_decisions_exist_only_in_live_events_not_in_traces(traces):
    data = traces["via"].to_dict()
    round_with_drafts = next(r for r in data["rounds"] if r["candidates"])
    round_with_drafts["candidates"][0]["decision"] = "pending"
    with pytest.raises(TraceError, match=r"rounds\[\d+\]\.candidates\[0\]\.decision"):
        check_trace(data)


def test_depth_and_size_are_checked_before_parsing_with_no_recursion_error(tmp_path):
    for text in ["[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000]:
        with pytest.raises(TraceError, match="nested 100,?000 deep"):
            load_trace_json(text)
        out = upload(tmp_path, text)
        assert 'data-kind="error"' in out[4] and "nested" in out[4]
    assert json_depth('{"a": "[[[[{{{{", "b": [{"c": "\\"["}]}') == 3  # brackets inside strings do not count
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(views.MAX_UPLOAD_BYTES + 1)
    out = views.replay_upload([str(big)])
    assert 'data-kind="error"' in out[4] and "larger than" in out[4]
    for text, words in [("[]", "empty list"), ("1" * 5000, "not JSON"), ("[1, 2]", "not a trace object")]:
        assert words in upload(tmp_path, text)[4]


def test_warning_toasts_escape_what_the_upload_carried(traces, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(gr, "Warning", lambda message, *a, **k: shown.append(message))
    data = traces["via"].to_dict()
    data["schema"] = XSS[0]
    upload(tmp_path, json.dumps(data))
    data = traces["via"].to_dict()
    data["method"] = XSS[1]
    upload(tmp_path, json.dumps(data))
    assert len(shown) == 2
    for message, payload in zip(shown, XSS):
        assert payload not in message and "&lt;" in message


# ---- stop means stop ------------------------------------------------------------------------------

def test_a_stop_pressed_while_the_run_waits_in_the_queue_cancels_that_run():
    queued = request("queued-stop")
    ticket, *_ = runs.take_run_ticket("light", queued)  # what Run's queue=False step does before the queue
    runs.stop_work(queued)  # Stop while it waits
    outs = list(runs.run_compare(*RUN_ARGS, ticket=ticket, request=queued))
    assert len(outs) == 1 and 'data-kind="stop"' in outs[0][4] and "before it started" in outs[0][4]
    assert outs[0][5] == gr.skip(), "the traces already shown are kept"

    later = request("queued-stop")  # the next run of the session is not touched by that earlier Stop
    ticket, *_ = runs.take_run_ticket("light", later)
    outs = list(runs.run_compare(*RUN_ARGS, ticket=ticket, request=later))
    assert 'data-kind="ok"' in outs[-1][4] and len(outs[-1][5]["via"].tokens) == 12


def test_a_sweep_stops_between_points_and_keeps_what_it_measured():
    req = request("sweep-stop")
    reports = []

    def progress(fraction, desc=""):
        reports.append(desc)
        if desc.startswith("sweep 2/"):  # plain SD and the first setting are measured
            runs.stop_work(req)  # what the Stop button calls

    fig, status = lab.measure_sweep(PROMPT, "random", 3, "slim", 0.0, 8, 0, "default", "0.5, 0.9", "0.0, 0.3",
                                    0.5, 0.0, request=req, progress=progress)
    assert 'data-kind="stop"' in status and "1 of 4 settings measured" in status
    assert not any(d.startswith("sweep 3/") for d in reports), "no point after the Stop is measured"
    tuned = [d for d in fig.data if d.name == "signal: slim"]
    assert len(tuned) == 1 and len(tuned[0].x) == 1, "the measured point is drawn"

    queued = request("sweep-stop")
    ticket, _ = lab.take_sweep_ticket("light", queued)  # what Measure sweep's queue=False step does
    runs.stop_work(queued)  # Stop while the sweep waits in the queue: nothing is measured
    fig, status = lab.measure_sweep(PROMPT, "random", 3, "slim", 0.0, 8, 0, "default", "0.5, 0.9", "0.0, 0.3",
                                    0.5, 0.0, ticket=ticket, request=queued, progress=progress)
    assert fig == gr.skip() and "before it started" in status


def test_a_large_grid_is_refused_before_any_work():
    values = ", ".join(f"{i / 10_000:.4f}" for i in range(10_001))
    start = time.perf_counter()
    first_percent = [(a, e) for a in range(1000) for e in range(1000)]  # 1% of what the grid would be
    bound = time.perf_counter() - start
    del first_percent
    for accepts, escalates, words in [(values, values, "at most"),
                                      (", ".join(f"{i / 100:.2f}" for i in range(60)),
                                       ", ".join(f"{i / 100:.2f}" for i in range(60)), "1,830 settings")]:
        start = time.perf_counter()
        with pytest.raises(gr.Error, match=words):
            lab.measure_sweep(PROMPT, "no-such-preset", 4, "slim", 0.0, 12, 0, "default", accepts, escalates, 0.5, 0.0)
        elapsed = time.perf_counter() - start
        assert elapsed < max(bound, 0.1), f"refused in {elapsed:.3f} s; building 1% of the grid takes {bound:.3f} s"


# ---- downloads: one temp folder per process -------------------------------------------------------

def test_trace_table_refreshes_reuse_one_temp_folder_per_session(traces, monkeypatch):
    state = {"via": traces["via"], "sd": traces["sd"]}
    views.trace_table(state, "via", request("downloads-a"))  # the process's folder exists from here on

    def no_new_folders(*args, **kwargs):
        raise AssertionError("a refresh made a new temp folder")

    monkeypatch.setattr(studio.downloads.tempfile, "mkdtemp", no_new_folders)
    paths = set()
    for n in range(12):
        session = ("downloads-a", "downloads-b")[n // 2 % 2]
        _, json_path, csv_path = views.trace_table(state, ("via", "sd")[n % 2], request(session))
        paths |= {json_path, csv_path}
        assert Trace.from_json(Path(json_path).read_text(encoding="utf-8")) == state[("via", "sd")[n % 2]]
    assert len(paths) == 8, "one JSON and one CSV per method and session, overwritten at each refresh"
    roots = {Path(p).parent.parent for p in paths}
    assert roots == {DOWNLOADS._root} and roots.pop().name.startswith("via-sd-")
    evil = DOWNLOADS.folder(SimpleNamespace(session_hash="../../../etc"))
    assert evil.parent == DOWNLOADS._root, "a session hash never names another path"
    folders = {Path(p).parent for p in paths}
    left = DOWNLOADS._root / DOWNLOADS._name(request("downloads-a"))
    assert left in folders and len(folders) == 2
    app.forget_session(request("downloads-a"))  # that visitor closed the page: their files go
    assert not left.exists() and all(f.exists() for f in folders - {left})


def test_the_download_folder_is_removed_at_exit(tmp_path):
    code = ("import app, via_sd; from studio import views; t = via_sd.generate(via_sd.tiny_random_pair(seed=0), "
            "'hi', 'sd', via_sd.DecodeConfig(gamma=2, max_new_tokens=4)); print(views.trace_table({'sd': t}, 'sd')[1])")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    written = Path(done.stdout.strip().splitlines()[-1])
    assert written.name == "via-sd-trace-sd.json" and written.parent.parent.name.startswith("via-sd-")
    assert not written.parent.parent.exists()


# ---- every API entry checks its own inputs ---------------------------------------------------------

@pytest.mark.parametrize("seed", [None, 2**70, 1.5, float("nan"), -1, "7"])
def test_bad_seeds_get_the_pages_message(seed):
    outs = list(runs.run_compare(*RUN_ARGS[:8], seed, "default", False))
    status = outs[-1][4]
    assert 'data-kind="error"' in status and "seed must be a whole number from 0 to 4,294,967,295" in status
    assert no_traces(outs[-1][5])


def no_traces(record: dict) -> bool:
    """A run record with nothing decoded: only the run's own bookkeeping (its ticket and preset)."""
    return isinstance(record, dict) and set(record) <= {"ticket", "preset"} and not runs.runs_of(record)


def test_learn_accepts_every_round_of_the_trace_and_only_those(traces):
    state = {"via": traces["via"]}
    rounds = len(traces["via"].rounds)
    assert rounds > 2
    for k in range(1, rounds + 1):
        assert f"round {k} of {rounds}" in views.learn_view(state, k)
    for k in (0, rounds + 1, 2.5, None, "3", -1):
        view = views.learn_view(state, k)
        assert 'data-state="error"' in view and f"from 1 to {rounds}" in view


def test_what_if_never_estimates_more_tokens_than_the_runs_limit(traces):
    trace = traces["via"]
    limit = trace.config["max_new_tokens"]
    unlimited = replace(trace, config={**trace.config, "max_new_tokens": 10**6})
    # Since via_sd.core.plan (59f3ef5) a round all in tier A runs no verifier pass and so has no bonus token, so
    # "tier A for every draft" no longer overshoots on these drafts; every setting of a grid is checked instead,
    # and the ones whose estimate would exceed the limit without the cap (e.g. every draft to the full model,
    # whose all-kept rounds add its bonus token) show the cap at work.
    settings = [{"accept": a, "escalate": e, "signal": signal} for signal in ("slim", "draft")
                for a in (0.0, 0.3, 0.6, 0.9, 1.0) for e in (0.0, 0.3, 0.6, 0.9, 1.0) if e <= a]
    overshoot = [th for th in settings if what_if(unlimited, th)["new_tokens"] > limit]
    assert overshoot, "without the cap some estimate would exceed the limit"
    for th in settings:
        est = what_if(trace, th)
        assert est["new_tokens"] <= limit and sum(est["tier_counts"].values()) == est["new_tokens"], th
        if th in overshoot:
            assert est["new_tokens"] == limit and sum(est["tier_counts"].values()) == limit, th
            assert any("capped" in n for n in est["notes"]), th
    own = what_if(trace, trace.config["thresholds"])
    assert own["new_tokens"] == len(trace.tokens), "the recorded thresholds still reproduce the recording"


# ---- shared deployment: the preset is fixed ---------------------------------------------------------

def test_the_preset_is_locked_on_a_space_and_free_locally(monkeypatch):
    monkeypatch.delenv("VIA_SD_LOCK_PRESET", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    MODELS.check_preset("embedded")  # locally any preset may be chosen (checked, not loaded)
    assert _preset_control(app.build_demo("random"))["interactive"] is not False

    monkeypatch.setenv("SPACE_ID", "someone/via-sd-studio")
    demo = app.build_demo("random")
    control = _preset_control(demo)
    assert control["interactive"] is False and "shared deployment" in control["info"]
    assert control["value"] == "random"
    device, status = app.load_preset("embedded")
    assert 'data-kind="error"' in status and "fixed on this shared deployment" in status
    outs = list(runs.run_compare(*RUN_ARGS[:1], "embedded", *RUN_ARGS[2:]))
    assert "fixed on this shared deployment" in outs[-1][4] and no_traces(outs[-1][5])
    MODELS.check_preset("random")  # the preset the page serves stays usable

    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("VIA_SD_LOCK_PRESET", "1")
    assert "fixed on this shared deployment" in app.load_preset("tiny")[1]


def _preset_control(demo) -> dict:
    return next(c["props"] for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "preset")


# ---- a live server: the queue, Stop and the API -----------------------------------------------------

@pytest.fixture(scope="module")
def server():
    import socket

    demo = app.build_demo("random")
    demo.queue(default_concurrency_limit=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def test_the_api_checks_its_inputs_like_the_page(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    outs = client.predict(*RUN_ARGS, api_name="/run")
    assert 'data-kind="ok"' in outs[4]
    rounds = int(re.search(r"(\d+) rounds", outs[0]).group(1))
    assert rounds > 2
    assert f"round {rounds} of {rounds}" in client.predict(rounds, api_name="/learn")
    with pytest.raises(Exception, match="Round .* does not exist"):
        client.predict(rounds + 1, api_name="/learn")
    bad_seed = client.predict(*RUN_ARGS[:8], 2**70, *RUN_ARGS[9:], api_name="/run")
    assert "seed must be a whole number" in bad_seed[4]


# ---- in a real browser: no payload runs ------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_no_uploaded_payload_runs_in_the_page(traces, server, tmp_path, chromium):
    files, payload = [], "".join(XSS)  # every payload at once in each field: any one that ran would show
    data = traces["via"].to_dict()  # shown fields take the payload as text; counted fields are refused
    data["prompt"] = data["text"] = data["device"] = payload
    data["models"]["drafter"] = payload
    data["tokens"][0]["text"] = payload
    next(r for r in data["rounds"] if r["candidates"])["candidates"][0]["text"] = payload
    files.append((tmp_path / "shown.json", data, "ok"))
    data = traces["via"].to_dict()
    data["summary"]["new_tokens"] = payload
    files.append((tmp_path / "counted.json", data, "error"))
    data = traces["via"].to_dict()
    data["schema"] = payload
    files.append((tmp_path / "schema.json", data, "error"))
    browser = chromium  # the session's one Chromium (tests/conftest.py): a second Playwright clashes with it
    for path, data, kind in files:
        path.write_text(json.dumps(data), encoding="utf-8")
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(90_000)
        page.goto(server, wait_until="domcontentloaded")
        page.wait_for_selector("#run")
        page.get_by_role("tab", name="Trace").click()
        page.locator("#trace-upload input[type=file]").set_input_files(str(path))
        page.wait_for_selector(f'#status [data-kind="{kind}"]')
        if kind == "ok":
            page.wait_for_selector("#via-tokens .via-tok")
            page.get_by_role("tab", name="Learn").click()
            page.wait_for_selector('#learn-view .via-learn[data-state="round"]')
            page.locator("#via-tokens .via-tok").first.hover()
        else:
            assert path.name in page.locator("#status").inner_text()
        page.wait_for_timeout(300)  # an onerror / onload would have fired by now
        assert page.evaluate("window.__xss") is None, f"{path.name}: a payload ran"
        page.close()
    page = browser.new_page()  # the control: the same payload, inserted unescaped, does run
    page.goto(server, wait_until="domcontentloaded")
    page.evaluate("html => document.body.insertAdjacentHTML('beforeend', html)", XSS[0])
    page.wait_for_function("window.__xss === 1", timeout=10_000)
    page.close()


# ---- through the API: a Stop while queued -----------------------------------------------------------
# Last in the file: this is the API twin of test_a_stop_pressed_while_the_run_waits_in_the_queue_cancels_that_run
# (the page's path is covered there and in test_app_browser.py).

def test_client_stop_while_queued_cancels_the_queued_run(server):
    from gradio_client import Client

    busy, waiting = Client(server, verbose=False), Client(server, verbose=False)
    long_run = list(RUN_ARGS)
    long_run[7] = 512
    first = busy.submit(*long_run, api_name="/run")
    deadline = time.time() + 120
    while time.time() < deadline and first.status().code.name not in ("PROCESSING", "ITERATING"):
        time.sleep(0.05)
    queued = waiting.submit(*RUN_ARGS, api_name="/run")  # waits behind the busy session's run
    time.sleep(0.5)
    assert not queued.done()
    waiting.predict(api_name="/stop")
    busy.predict(api_name="/stop")
    while not queued.done():
        time.sleep(0.05)
    status = queued.outputs()[-1][4]
    assert 'data-kind="stop"' in status and "before it started" in status
    deadline = time.time() + 60  # the busy run ends at its next token; its last update may still be on the way
    while time.time() < deadline and not first.done():
        time.sleep(0.05)
    assert first.done(), "Stop did not end the busy session's run"
    assert 'data-kind="stop"' in first.outputs()[-1][4]

    outs = waiting.predict(*RUN_ARGS, api_name="/run")  # the next run of that session runs in full
    assert 'data-kind="ok"' in outs[4]
    assert int(re.search(r"(\d+) rounds", outs[0]).group(1)) > 2
