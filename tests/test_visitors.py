"""Many visitors, some hostile (issue 36): every input gate costs time linear in its input and nothing one
visitor sends stalls another; Stop stops a run, never a future one; a visitor's files and state go when the
visitor does (or the server does, SIGTERM included); every refusal names the field and what it allows.

One app server for the module, on the "random" preset (a tiny random pair: real decoding in milliseconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gradio_client import Client

from via_sd.core.trace_check import MAX_JSON_BYTES, TraceError, json_depth, parse_json

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a haiku about the sea."
# prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route, with_ar, drafter
COMPARE = dict(prompt=PROMPT, preset="random", gamma=4, accept=0.6, escalate=0.2, signal="slim", temperature=0.0,
               max_new_tokens=12, seed=0, route="default", with_ar=False, drafter="model")
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


def answered_meanwhile(server: str, work) -> tuple[float, list[float]]:
    """Run `work()` while another visitor asks the server small things: (seconds `work` took, the slowest answer
    the other visitor got, in seconds, for each of its requests)."""
    import httpx

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


# ---- every gate is linear in its input ---------------------------------------------------------------

def test_the_trace_gate_refuses_the_worst_texts_at_the_size_limit_in_under_a_second():
    for name, text in WORST.items():
        start = time.perf_counter()
        try:
            parse_json(text)
        except TraceError:
            pass
        assert time.perf_counter() - start < 1.0, name
    assert json_depth('{"a": "[[[[{{{{", "b": [{"c": "\\"["}]}') == 3
    assert json_depth('["\\\\", [["\\\\\\"]"]]]') == 3  # an escaped backslash ends no string; an escaped quote does


def test_a_hostile_trace_at_the_limit_stalls_no_other_visitor(server):
    client = Client(server, verbose=False)
    for name in ("a string that never closes, all escaped quotes", "brackets nested all the way"):
        def send():
            with pytest.raises(Exception, match="not a VIA-SD trace"):
                client.predict(WORST[name], 0.6, 0.2, "slim", api_name="/what_if_estimate")

        took, waits = answered_meanwhile(server, send)
        assert took < 8, f"{name}: {took:.1f} s (upload and refusal)"
        assert waits and max(waits) < 1.5, f"{name}: another visitor waited {max(waits):.2f} s"


# ---- Stop stops a run, never a future one -------------------------------------------------------------

def test_a_stop_with_nothing_running_stops_no_later_run(server):
    client = Client(server, verbose=False)
    status = client.predict(api_name="/stop")
    assert "Nothing to stop" in status
    result = client.predict(*COMPARE.values(), api_name="/compare")
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
    path.write_text(json.dumps(inflated(trace, 20)), encoding="utf-8")
    return path


def wait_for(check, timeout: float = 20.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_closed_sessions_give_their_replays_memory_back(server, long_trace):
    """Three sessions replay a long trace (and write its files), then close: the server's size falls back near
    where it started (a closed session's state used to stay an hour; this process is the server)."""
    from gradio_client import handle_file

    from studio.memory import give_back_freed_memory

    def replay(sessions: int) -> list[Client]:
        clients = [Client(server, verbose=False) for _ in range(sessions)]
        for client in clients:
            out = client.predict([handle_file(str(long_trace))], api_name="/replay")
            assert 'data-kind="ok"' in out[4], out[4][:300]
            client.predict("via", api_name="/trace_files")  # the table and its files too
        return clients

    def closed(clients: list[Client]) -> None:
        for client in clients:
            client.close()
        holder = state_holder_of(clients[0].session_hash)
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


def state_holder_of(session_hash: str):
    """Gradio's per-session state that holds `session_hash` (the module's server runs in this process)."""
    import gc

    from gradio.state_holder import StateHolder

    holders = [o for o in gc.get_objects() if isinstance(o, StateHolder) and session_hash in o.session_data]
    assert len(holders) == 1
    return holders[0]


def test_sigterm_removes_the_download_folder_and_gradios_copies(tmp_path):
    """`python app.py` on the random pair writes a visitor's trace files, then gets SIGTERM (a container
    stopping): it exits cleanly, and neither its download folder nor Gradio's copies of the files are left."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VIA_SD_PRESET": "random", "GRADIO_SERVER_PORT": str(port), "TMPDIR": str(tmp_path),
           "GRADIO_TEMP_DIR": str(tmp_path / "gradio"), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        assert wait_for(lambda: server.poll() is None and _up(url), timeout=120), "the app did not start"
        client = Client(url, verbose=False)
        out = client.predict(PROMPT, "random", 4, 0.6, 0.2, "slim", 0.0, 8, 0, "default", False, 0, api_name="/run")
        assert 'data-kind="ok"' in out[4]
        client.predict("via", api_name="/trace_files")
        folders = list(tmp_path.glob("via-sd-*"))
        assert len(folders) == 1 and list(folders[0].glob("*/via-sd-trace-via.json"))
        assert list((tmp_path / "gradio").rglob("via-sd-trace-via.json")), "Gradio served a copy"
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0, server.stderr.read()[-2000:]
    finally:
        if server.poll() is None:
            server.kill()
    assert not list(tmp_path.glob("via-sd-*")), "the download folder outlived SIGTERM"
    assert not list((tmp_path / "gradio").rglob("via-sd-trace-*")), "Gradio's copies outlived SIGTERM"


def _up(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "gradio_api/info", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ---- refusals name the field; a fuzz of hostile inputs ----------------------------------------------------

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
def test_compare_refuses_a_bad_setting_by_name_with_its_range(server, field, value, words):
    client = Client(server, verbose=False)
    with pytest.raises(Exception) as refused:
        client.predict(*{**COMPARE, field: value}.values(), api_name="/compare")
    assert words in str(refused.value), str(refused.value)[:300]


def test_raw_rest_refuses_nan_and_infinity_by_name(server):
    """JSON's NaN / Infinity (Python's json writes them) reach the handler through the queue as floats."""
    import httpx

    for value in ("NaN", "Infinity", "1e400"):
        data = list(COMPARE.values())
        data[8] = "SEED"
        body = json.dumps({"data": data}).replace('"SEED"', value)
        with httpx.Client(base_url=server, timeout=60) as http:
            event = http.post("gradio_api/call/compare", content=body,
                              headers={"content-type": "application/json"}).json()["event_id"]
            reply = http.get(f"gradio_api/call/compare/{event}").text
        assert "event: error" in reply and "seed must be a whole number from 0 to 4,294,967,295" in reply, reply[:300]


def test_race_speed_and_preset_accept_their_choices_and_name_the_rest(server):
    client = Client(server, verbose=False)
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/race"]["parameters"]
    speed = next(p for p in info if p["parameter_name"] == "speed")
    advertised = speed["type"].get("enum") or speed["type"].get("anyOf", [{}])[0].get("enum")
    assert advertised == ["0.25", "0.5", "1", "2", "4"], speed["type"]
    for value in advertised:
        assert "race" in client.predict(value, api_name="/race")  # no run yet: the hint, not an error
    with pytest.raises(Exception, match="race speed must be one of"):
        client.predict("3", api_name="/race")
    with pytest.raises(Exception, match="preset must be one of"):
        client.predict(None, api_name="/load_preset")


HOSTILE = [None, True, False, "", " ", "abc", "yes", "0.5", -1, 0, 1, 1.5, 2**70, -1e300, 1e300, [], {}, [1, 2],
           {"a": [[[]]]}, "\u202e\u0000", "💥" * 50, '<img src=x onerror="window.__x=1">', "x" * 10_000,
           "[" * 5_000, '"' + '\\"' * 5_000]


def test_a_fuzz_of_hostile_inputs_gets_named_refusals_or_results_and_the_app_keeps_answering(server, long_trace):
    """A few hundred hostile inputs (types, ranges, unicode, huge and deep payloads) against /compare,
    /what_if_estimate, /race and /learn: each answer is a result or a refusal that names the field, none takes
    more than a few seconds, and a normal /compare runs after every batch."""
    import random

    rng = random.Random(36)
    client = Client(server, verbose=False)
    trace = json.loads(long_trace.read_text(encoding="utf-8"))
    trace["rounds"], trace["tokens"] = trace["rounds"][:20], trace["tokens"][:60]
    counts = {"refused": 0, "answered": 0}
    slowest = 0.0

    def call(api_name, args, fields):
        nonlocal slowest
        start = time.perf_counter()
        try:
            out = client.predict(*args, api_name=api_name)
            counts["answered"] += 1
            if api_name == "/compare":
                assert out["status"] == "done", out["message"]
        except Exception as err:  # a refusal: it names one of the fields it was given
            message = str(err)
            assert any(f in message for f in fields), f"{api_name} {fields}: {message[:300]}"
            counts["refused"] += 1
        slowest = max(slowest, time.perf_counter() - start)
        assert time.perf_counter() - start < 5, f"{api_name} {fields} took {time.perf_counter() - start:.1f} s"

    for batch in range(3):
        for _ in range(40):
            fields = rng.sample([f for f in COMPARE if f != "max_new_tokens"], rng.choice((1, 1, 2)))
            values = {f: rng.choice(HOSTILE) for f in fields}
            names = {"preset": ("preset",), "prompt": ("prompt",)}
            words = [w for f in fields for w in names.get(f, (f,))]
            call("/compare", list({**COMPARE, "max_new_tokens": 4, **values}.values()), words)
        for _ in range(20):
            mutated = json.loads(json.dumps(trace))
            where = rng.choice(["summary", "config", "tokens", "rounds", "models", "schema", "method", "prompt"])
            mutated[where] = rng.choice(HOSTILE)
            text = rng.choice([json.dumps(mutated), rng.choice(HOSTILE)])
            call("/what_if_estimate", [text, 0.6, 0.2, "slim"], ["trace", "not JSON", "No trace"])
            call("/what_if_estimate", [json.dumps(trace), rng.choice(HOSTILE), 0.2, "slim"], ["accept", "escalate"])
        for _ in range(10):
            call("/race", [rng.choice(HOSTILE)], ["race speed"])
            call("/learn", [rng.choice(HOSTILE)], ["round"])
        assert client.predict(*COMPARE.values(), api_name="/compare")["status"] == "done", f"after batch {batch}"
    print(f"fuzz: {counts['refused']} refused by name, {counts['answered']} answered, slowest {slowest:.2f} s")
    assert counts["refused"] > 150
