"""Many visitors, some hostile (issue 36): every input gate costs time linear in its input and nothing one
visitor sends stalls another; Stop stops a run, never a future one; a visitor's files and state go when the
visitor does (or the server does, SIGTERM included); every refusal names the field and what it allows.

One app server for the module, on the "random" preset (a tiny random pair: real decoding in milliseconds), and
one visitor of it for the tests that need no session of their own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from studio.inputs import KNOBS
from via_sd.core.trace_check import MAX_JSON_BYTES, TraceError, json_depth, parse_json

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a haiku about the sea."
# the endpoints' arguments, in order
COMPARE = dict(prompt=PROMPT, preset="random", gamma=4, accept=0.6, escalate=0.2, signal="slim", temperature=0.0,
               max_new_tokens=12, seed=0, route="default", with_ar=False, drafter="model", **KNOBS)
RUN = dict(prompt=PROMPT, preset="random", gamma=4, accept=0.6, escalate=0.2, signal="slim", temperature=0.0,
           max_new_tokens=12, seed=0, route="default", with_ar=False, pace=0, drafter="model")
SWEEP = dict(prompt=PROMPT, preset="random", gamma=4, signal="slim", temperature=0.0, max_new_tokens=4, seed=0,
             route="default", accepts="0.5", escalates="0.0", accept=0.6, escalate=0.2, theme="light")
WHAT_IF = dict(accept=0.6, escalate=0.2, signal="slim")
N = MAX_JSON_BYTES - 2
WORST = {  # the texts that cost the old gate or the parser most, each at the size limit
    "a string that never closes, all escaped quotes": '"' + '\\"' * (N // 2),
    "brackets nested all the way": "[" * N,
    "objects nested all the way": '{"a":' * (N // 5),
    "one long string": '"' + "a" * (N - 2) + '"',
    "quotes that open a string each": '"[' * (N // 2),
    "backslashes only": "\\" * N,
    "millions of empty lists": "[" + "[]," * (N // 3 - 1) + "1]",
    "millions of numbers": "[" + "1," * (N // 2 - 1) + "1]",
}


@pytest.fixture(scope="module")
def server(serve_random_app):
    return serve_random_app()


@pytest.fixture(scope="module")
def visitor(server):
    """A visitor who has run the random pair once: their traces are that short run (not the recorded one a page
    may open on), so a race replays in a blink and Learn has its rounds."""
    client = Client(server, verbose=False)
    out = client.predict(*RUN.values(), api_name="/run")
    assert 'data-kind="ok"' in out[4], out[4][:300]
    yield client
    client.close()


def answered_meanwhile(server: str, work) -> tuple[float, list[float]]:
    """Run `work()` while another visitor asks the server small things: (seconds `work` took, the slowest answer
    the other visitor got, in seconds, for each of its requests)."""
    done, waits = threading.Event(), []

    def other_visitor():
        with httpx.Client(timeout=30) as http:
            while not done.is_set():
                start = time.perf_counter()
                http.get(server + "gradio_api/info").raise_for_status()
                waits.append(time.perf_counter() - start)
                time.sleep(0.02)

    watcher = threading.Thread(target=other_visitor)
    watcher.start()
    time.sleep(0.2)
    start = time.perf_counter()
    try:
        work()
    finally:
        took = time.perf_counter() - start
        done.set()
        watcher.join()
    return took, waits


class Refused(Exception):
    """An endpoint's refusal over the REST API: its message."""


def rest(http: httpx.Client, api_name: str, data: list, session_hash: str):
    """One call over the REST API, through the queue as a client's: the endpoint's output, or Refused with its
    message. No gradio_client: it polls for each reply every 50 ms (most of a short call's time), and its
    heartbeat stream outlives the call (a stopping server waits for it)."""
    body = {"data": data, "session_hash": session_hash}
    event = http.post(f"gradio_api/call{api_name}", json=body).json()["event_id"]
    reply = http.get(f"gradio_api/call{api_name}/{event}").text
    kind, _, value = reply.strip().rpartition("\n\n")[2].partition("\n")  # the last event: its kind, its data
    if kind == "event: error":
        raise Refused(str((json.loads(value.removeprefix("data:")) or {}).get("error")))
    assert kind == "event: complete", reply[-500:]
    return json.loads(value.removeprefix("data:"))


# ---- every gate is linear in its input ---------------------------------------------------------------

def test_the_trace_gate_refuses_the_worst_texts_at_the_size_limit_in_under_a_second():
    for name, text in WORST.items():
        start = time.thread_time()  # this thread's CPU time: what the gate costs, whatever else the machine runs
        try:
            parse_json(text)
        except TraceError:
            pass
        assert time.thread_time() - start < 1.0, name
    assert json_depth('{"a": "[[[[{{{{", "b": [{"c": "\\"["}]}') == 3
    assert json_depth('["\\\\", [["\\\\\\"]"]]]') == 3  # an escaped backslash ends no string; an escaped quote does


def test_a_hostile_trace_at_the_limit_stalls_no_other_visitor(server, visitor):
    for name in ("a string that never closes, all escaped quotes", "brackets nested all the way"):
        def send():
            with pytest.raises(Exception, match="not a VIA-SD trace"):
                visitor.predict(WORST[name], 0.6, 0.2, "slim", api_name="/what_if_estimate")

        took, waits = answered_meanwhile(server, send)
        assert took < 8, f"{name}: {took:.1f} s (upload and refusal)"
        assert waits and max(waits) < 1.5, f"{name}: another visitor waited {max(waits):.2f} s"


# ---- Stop stops a run, never a future one -------------------------------------------------------------

def test_a_stop_with_nothing_running_stops_no_later_run(visitor):
    status = visitor.predict(api_name="/stop")
    assert "Nothing to stop" in status
    result = visitor.predict(*COMPARE.values(), api_name="/compare")
    assert result["status"] == "done" and result["methods"]["via"]["summary"]["new_tokens"] == 12


# ---- what a visitor leaves goes with them ---------------------------------------------------------------

def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def inflated(trace, times: int) -> dict:
    """`trace` (as a dict) with its rounds and tokens repeated `times` over, renumbered: a long run's trace."""
    data = trace.to_dict()
    rounds, tokens = data["rounds"], data["tokens"]
    last_round = max(r["round"] for r in rounds) + 1
    data["rounds"] = [{**r, "round": r["round"] + k * last_round} for k in range(times) for r in rounds]
    data["tokens"] = [{**t, "i": t["i"] + k * len(tokens), "round": t["round"] + k * last_round}
                      for k in range(times) for t in tokens]
    data["token_ids"] = data["token_ids"] * times
    data["text"] = data["text"] * times
    data["config"]["max_new_tokens"] = len(data["tokens"])
    data["summary"]["new_tokens"] = len(data["tokens"])
    return data


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory, tiny_routed_pair):
    from via_sd import DecodeConfig, Thresholds, generate

    trace = generate(tiny_routed_pair, PROMPT, "via", DecodeConfig(gamma=4, max_new_tokens=96, seed=0,
                                                                   thresholds=Thresholds(accept=0.6, escalate=0.2)))
    path = tmp_path_factory.mktemp("long") / "via-sd-trace-via.json"
    path.write_text(json.dumps(inflated(trace, 20)), encoding="utf-8")  # 1,920 tokens, 1.9 MB
    return path


def wait_for(check, timeout: float = 20.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.fixture(scope="module")
def app_process(tmp_path_factory):
    """`python app.py` on the random pair, in a process of its own with its own temp folder, for the SIGTERM test.
    Started by the first test that asks for it: the memory test does, so the seconds of imports the process
    takes to start overlap the tests in between (they run in this process, on the other core)."""
    tmp = tmp_path_factory.mktemp("sigterm")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VIA_SD_PRESET": "random", "GRADIO_SERVER_PORT": str(port), "TMPDIR": str(tmp),
           "GRADIO_TEMP_DIR": str(tmp / "gradio"), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    with open(tmp / "stderr.txt", "w") as log:  # a file, not a pipe: nobody reads it while the app runs
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                   stderr=log)
    yield process, f"http://127.0.0.1:{port}/", tmp
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.usefixtures("app_process")  # starts now: see app_process
def test_closed_sessions_give_their_replays_memory_back(server, long_trace, monkeypatch):
    """Sessions replay a long trace (and write its files), then close: the server's size falls back near where it
    started (a closed session's state used to stay an hour; this process is the server)."""
    from gradio_client import handle_file

    from studio.memory import give_back_freed_memory

    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.2")  # a closed client is seen gone in a blink, not in 15 s

    def replay(sessions: int) -> list[Client]:
        clients = [Client(server, verbose=False) for _ in range(sessions)]
        for client in clients:
            out = client.predict([handle_file(str(long_trace))], api_name="/replay")
            assert 'data-kind="ok"' in out[4], out[4][:300]
            client.predict("via", api_name="/trace_files")  # the table and its files too
        return clients

    def closed(clients: list[Client]) -> None:
        holder = state_holder_of(server)
        assert all(c.session_hash in holder.session_data for c in clients)
        for client in clients:
            client.close()
        assert wait_for(lambda: not any(c.session_hash in holder.session_data for c in clients)), \
            "a closed session's state is still held"
        give_back_freed_memory()

    closed(replay(1))  # one-time costs (imports, templates, caches) before the baseline
    start = rss_mb()
    clients = replay(2)
    during = rss_mb()
    closed(clients)
    after = rss_mb()
    print(f"RSS {start:.0f} MB -> {during:.0f} MB with two sessions -> {after:.0f} MB once closed")
    assert during - start > 15, f"{during - start:.0f} MB for two sessions: not a test of anything"
    assert after - start < 0.35 * (during - start) + 10, f"{start:.0f} -> {during:.0f} -> {after:.0f} MB"


def state_holder_of(server: str):
    """Gradio's per-session state of the module's server (it runs in this process)."""
    import gradio as gr

    demo = next(b for b in gr.Blocks.get_instances() if getattr(b, "local_url", None) == server)
    return demo.server_app.state_holder


# ---- refusals name the field -------------------------------------------------------------------------------

BAD_COMPARE = [  # (field, value, words the refusal must hold)
    ("max_new_tokens", "abc", "max_new_tokens must be a whole number from 1 to 4,096"),
    ("max_new_tokens", None, "max_new_tokens must be a whole number from 1 to 4,096"),
    ("max_new_tokens", 10**6, "max_new_tokens must be a whole number from 1 to 4,096"),
    ("seed", "x", "seed must be a whole number from 0 to 4,294,967,295"),
    ("seed", 1.5, "seed must be a whole number from 0 to 4,294,967,295"),
    ("seed", -1, "seed must be a whole number"),
    ("accept", "0.5", "accept must be a number from 0 to 1"),
    ("accept", None, "accept must be a number from 0 to 1"),
    ("gamma", None, "gamma must be a whole number from 0 to 64"),
    ("temperature", None, "temperature must be a number from 0 to 5"),
    ("temperature", 7, "temperature must be a number from 0 to 5"),
    ("with_ar", "yes", "with_ar must be true or false"),
    ("with_ar", 2, "with_ar must be true or false"),
    ("prompt", ["a", "list"], "prompt must be text"),
    ("prompt", {"a": 1}, "prompt must be text"),
    ("prompt", "x" * 7000, "the limit here is 6,000"),
    ("signal", None, "signal must be one of 'slim', 'draft'"),
    ("drafter", None, "drafter must be one of 'model'"),
    ("drafter", "oracle", "drafter must be one of 'model'"),
    ("route", None, "route must be a name"),
    ("preset", None, "preset must be a name"),
]


@pytest.mark.parametrize("field,value,words", BAD_COMPARE, ids=[f"{f}={str(v)[:12]!r}" for f, v, _ in BAD_COMPARE])
def test_compare_refuses_a_bad_setting_by_name_with_its_range(visitor, field, value, words):
    with pytest.raises(Exception) as refused:
        visitor.predict(*{**COMPARE, field: value}.values(), api_name="/compare")
    assert words in str(refused.value), str(refused.value)[:300]


BAD_PAGE_ENDPOINTS = [  # (endpoint, its arguments, field, value, words the refusal must hold)
    ("/sweep_plot", SWEEP, "seed", "x", "seed must be a whole number from 0 to 4,294,967,295"),
    ("/sweep_plot", SWEEP, "max_new_tokens", 10**6, "max_new_tokens must be a whole number from 1 to 4,096"),
    ("/sweep_plot", SWEEP, "accept", "0.6", "accept must be a number from 0 to 1"),
    ("/sweep_plot", SWEEP, "accepts", "high", "accept values: write numbers between 0 and 1"),
    ("/sweep_plot", SWEEP, "escalates", [0.1], "escalate values: write at most"),
    ("/sweep_plot", SWEEP, "preset", None, "preset must be a name"),
    ("/sweep_plot", SWEEP, "route", 7, "route must be a name"),
    ("/what_if", WHAT_IF, "accept", "0.6", "accept must be a number from 0 to 1"),
    ("/what_if", WHAT_IF, "escalate", None, "escalate must be a number from 0 to 1"),
    ("/what_if", WHAT_IF, "signal", "full", "signal must be one of 'slim', 'draft'"),
    ("/learn", {"k": 1}, "k", "abc", "round must be a whole number from 1 to"),
    ("/learn", {"k": 1}, "k", 0, "round must be a whole number from 1 to"),
    ("/learn", {"k": 1}, "k", 10**6, "Round 1000000 does not exist"),
]


@pytest.mark.parametrize("endpoint,args,field,value,words", BAD_PAGE_ENDPOINTS,
                         ids=[f"{e}:{f}={str(v)[:12]!r}" for e, _, f, v, _ in BAD_PAGE_ENDPOINTS])
def test_sweep_what_if_and_learn_refuse_a_bad_setting_by_name(visitor, endpoint, args, field, value, words):
    """The page's endpoints that take settings get them as sent, as /compare does: a bad one is refused by name."""
    with pytest.raises(Exception) as refused:
        visitor.predict(*{**args, field: value}.values(), api_name=endpoint)
    assert words in str(refused.value), str(refused.value)[:300]


def test_sweep_what_if_and_learn_answer_what_the_page_sends(visitor):
    """Taken as sent, the values the page's own controls send still work."""
    _, status = visitor.predict(*SWEEP.values(), api_name="/sweep_plot")
    assert 'data-kind="ok"' in status and "Sweep done: 1 settings" in status, status[:300]
    assert "estimate" in visitor.predict(*WHAT_IF.values(), api_name="/what_if").lower()
    assert "round 1 of" in visitor.predict(1, api_name="/learn")
    assert "round 1 of" in visitor.predict(1.0, api_name="/learn")  # a slider's number


def test_raw_rest_refuses_nan_and_infinity_by_name(server):
    """JSON's NaN / Infinity (Python's json writes them) reach the handler through the queue as floats."""
    for value in ("NaN", "Infinity", "1e400"):
        data = list(COMPARE.values())
        data[8] = "SEED"
        body = json.dumps({"data": data}).replace('"SEED"', value)
        with httpx.Client(base_url=server, timeout=60) as http:
            event = http.post("gradio_api/call/compare", content=body,
                              headers={"content-type": "application/json"}).json()["event_id"]
            reply = http.get(f"gradio_api/call/compare/{event}").text
        assert "event: error" in reply and "seed must be a whole number from 0 to 4,294,967,295" in reply, reply[:300]


def test_race_speed_and_preset_accept_their_choices_and_name_the_rest(visitor):
    info = visitor.view_api(return_format="dict", print_info=False)["named_endpoints"]["/race"]["parameters"]
    speed = next(p for p in info if p["parameter_name"] == "speed")
    advertised = speed["type"].get("enum") or speed["type"].get("anyOf", [{}])[0].get("enum")
    assert advertised == ["0.25", "0.5", "1", "2", "4"], speed["type"]
    for value in advertised:
        assert "race" in visitor.predict(value, api_name="/race")  # the visitor's short run, replayed
    with pytest.raises(Exception, match="race speed must be one of"):
        visitor.predict("3", api_name="/race")
    with pytest.raises(Exception, match="preset must be one of"):
        visitor.predict(None, api_name="/load_preset")


# ---- a fuzz of hostile inputs -------------------------------------------------------------------------------

HOSTILE = [None, True, False, "", " ", "abc", "yes", "0.5", -1, 0, 1, 1.5, 2**70, -1e300, 1e300, [], {}, [1, 2],
           {"a": [[[]]]}, "\u202e\u0000", "💥" * 50, '<img src=x onerror="window.__x=1">', "x" * 10_000,
           "[" * 5_000, '"' + '\\"' * 5_000]
WORDS = {"accepts": "accept values", "escalates": "escalate values"}  # what a refusal calls a field


def with_hostile(rng: random.Random, args: dict, fields: list[str]) -> tuple[list, list[str]]:
    """`args` with one or two of `fields` hostile: (the arguments, the words one of which the refusal must hold)."""
    chosen = rng.sample(fields, rng.choice((1, 1, 2)))
    return list({**args, **{f: rng.choice(HOSTILE) for f in chosen}}.values()), [WORDS.get(f, f) for f in chosen]


def hostile_batch(rng: random.Random, trace: dict) -> list[tuple[str, list, list[str]]]:
    """100 hostile calls (endpoint, arguments, words): types, ranges, unicode, huge and deep payloads, mutated
    traces, against the endpoints that take settings or a trace as JSON."""
    compare = {**COMPARE, "max_new_tokens": 4}
    calls = [("/compare", *with_hostile(rng, compare, [f for f in compare if f != "max_new_tokens"]))
             for _ in range(34)]
    for _ in range(16):
        mutated = json.loads(json.dumps(trace))
        mutated[rng.choice(["summary", "config", "tokens", "rounds", "models", "schema", "method", "prompt"])] = \
            rng.choice(HOSTILE)
        text = rng.choice([json.dumps(mutated), rng.choice(HOSTILE)])
        calls.append(("/what_if_estimate", [text, *WHAT_IF.values()], ["trace", "not JSON", "No trace"]))
        calls.append(("/what_if_estimate", [json.dumps(trace), *with_hostile(rng, WHAT_IF, list(WHAT_IF))[0]],
                      list(WHAT_IF)))
    calls += [("/what_if", *with_hostile(rng, WHAT_IF, list(WHAT_IF))) for _ in range(10)]
    calls += [("/sweep_plot", *with_hostile(rng, SWEEP, [f for f in SWEEP if f != "max_new_tokens"])) for _ in range(8)]
    calls += [("/race", [rng.choice(HOSTILE)], ["race speed"]) for _ in range(8)]
    calls += [("/learn", [rng.choice(HOSTILE)], ["round", "Round"]) for _ in range(8)]
    rng.shuffle(calls)
    return calls


def test_a_fuzz_of_hostile_inputs_gets_named_refusals_or_results_and_the_app_keeps_answering(server, visitor,
                                                                                            long_trace):
    """Two hundred hostile inputs against /compare, /what_if_estimate, /what_if, /sweep, /race and /learn, sent as
    the visitor's: each answer is a result or a refusal that names the field, none takes more than a few seconds,
    and a normal /compare runs after every batch."""
    rng = random.Random(36)
    trace = json.loads(long_trace.read_text(encoding="utf-8"))
    trace["rounds"], trace["tokens"] = trace["rounds"][:8], trace["tokens"][:24]

    def call(http, api_name, args, words) -> tuple[bool, float]:
        """(refused?, seconds) of one call."""
        start = time.perf_counter()
        try:
            out = rest(http, api_name, args, visitor.session_hash)
            refused = False
            if api_name == "/compare":
                assert out[0]["status"] == "done", out[0]["message"]
        except Refused as err:  # it names one of the fields it was given
            assert any(w in str(err) for w in words), f"{api_name} {words}: {str(err)[:300]}"
            refused = True
        took = time.perf_counter() - start
        assert took < 5, f"{api_name} {words} took {took:.1f} s"
        return refused, took

    answers = []
    with httpx.Client(base_url=server, timeout=30) as http:
        for batch in range(2):
            answers += [call(http, *c) for c in hostile_batch(rng, trace)]
            assert visitor.predict(*COMPARE.values(), api_name="/compare")["status"] == "done", f"after batch {batch}"
    refused = sum(r for r, _ in answers)
    print(f"fuzz: {refused} refused by name, {len(answers) - refused} answered, "
          f"slowest {max(t for _, t in answers):.2f} s")
    assert len(answers) == 200 and refused > 150


# ---- the server's end --------------------------------------------------------------------------------------

def test_sigterm_removes_the_download_folder_and_gradios_copies(app_process):
    """`python app.py` on the random pair writes a visitor's trace files, then gets SIGTERM (a container
    stopping): it exits cleanly, and neither its download folder nor Gradio's copies of the files are left."""
    process, url, tmp = app_process

    def up() -> bool:
        try:
            return httpx.get(url + "gradio_api/info", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for(lambda: process.poll() is None and up(), timeout=120), "the app did not start"
    with httpx.Client(base_url=url, timeout=60) as http:  # no gradio_client: no heartbeat for the app to wait on
        out = rest(http, "/run", list({**RUN, "max_new_tokens": 8}.values()), "sigterm-visitor")
        assert 'data-kind="ok"' in out[4]
        rest(http, "/trace_files", ["via"], "sigterm-visitor")
    folders = list(tmp.glob("via-sd-*"))
    assert len(folders) == 1 and list(folders[0].glob("*/via-sd-trace-via.json"))
    assert list((tmp / "gradio").rglob("via-sd-trace-via.json")), "Gradio served a copy"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, (tmp / "stderr.txt").read_text()[-2000:]
    assert not list(tmp.glob("via-sd-*")), "the download folder outlived SIGTERM"
    assert not list((tmp / "gradio").rglob("via-sd-trace-*")), "Gradio's copies outlived SIGTERM"
