"""The app's MCP server (`studio.mcp_tools`) driven by the `mcp` package's own client against a live app on the random
pair: the tools an agent sees (none of the page's endpoints), compare's compact JSON, a trace from it passed back to
what_if_estimate, a long call stopped, and two connections that see and stop only their own runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import app
from via_sd import THRESHOLD_PRESETS

pytest.importorskip("mcp")
PROMPT = "Write a haiku about the sea."
LONG = {"prompt": PROMPT, "max_new_tokens": 2000, "with_ar": False}  # tens of seconds unless stopped


@pytest.fixture(scope="module")
def mcp_url(serve_random_app):
    return serve_random_app(**app.mcp_options(wanted=True)) + "gradio_api/mcp/"


def run(coroutine):
    """An MCP exchange in a thread of its own (the browser tests' Playwright may hold this thread's event loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=120)


@contextlib.asynccontextmanager
async def connect(url: str):
    """One MCP connection, as an agent's client opens it."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def loads(result) -> dict | list:
    assert not result.isError, result.content[0].text
    return json.loads(result.content[0].text)


async def running(session, deadline_s: float = 30) -> list[dict]:
    """This connection's runs once one is running (polled)."""
    for _ in range(int(deadline_s / 0.05)):
        runs = [r for r in loads(await session.call_tool("runs", {})) if r["status"] == "running"]
        if runs:
            return runs
        await asyncio.sleep(0.05)
    raise AssertionError("no run of this connection started")


def test_tools_are_named_by_what_they_do_and_no_page_endpoint_is_one(mcp_url):
    async def exchange():
        async with connect(mcp_url) as session:
            return (await session.list_tools()).tools

    tools = {t.name: t for t in run(exchange())}
    assert set(tools) == {"compare", "bench", "sweep", "what_if_estimate", "runs", "stop"}
    properties = tools["compare"].inputSchema["properties"]
    for knob in ("top_p", "draft_stop", "max_unverified", "chat", "drafter", "gamma", "traces", "budget_s"):
        assert len(properties[knob]["description"]) > 10, knob
    assert "preset" not in properties and tools["compare"].inputSchema["required"] == ["prompt"]
    assert {"prompts", "methods", "repeats"} <= set(tools["bench"].inputSchema["properties"])
    import httpx

    assert "Tools: compare, bench, sweep" in httpx.get(mcp_url, timeout=10).text, "a browser is told what is here"


def test_compare_answers_compact_json_whose_trace_what_if_estimate_takes(mcp_url):
    async def exchange():
        async with connect(mcp_url) as session:
            bare = await session.call_tool("compare", {"prompt": PROMPT, "max_new_tokens": 8, "with_ar": False})
            traced = await session.call_tool("compare", {"prompt": PROMPT, "max_new_tokens": 12, "with_ar": False,
                                                         "traces": "via", "top_p": 0.9, "temperature": 0.7})
            trace = loads(traced)["methods"]["via"]["trace"]
            estimate = await session.call_tool("what_if_estimate", {"trace": trace, "accept": 0.9, "escalate": 0.1})
            bad = await session.call_tool("compare", {"prompt": PROMPT, "top_p": 0})
            preset = await session.call_tool("compare", {"prompt": PROMPT, "max_new_tokens": 4, "with_ar": False,
                                                         "thresholds": "fastest", "accept": 0.9})
            return bare, traced, estimate, bad, loads(preset)["settings"]

    bare, traced, estimate, bad, preset = run(exchange())
    assert "\n" not in bare.content[0].text and ", " not in bare.content[0].text[:200], "compact JSON"
    result = loads(bare)
    assert result["schema"] == "via-sd-comparison/1" and result["status"] == "done" and len(result["run_id"]) == 12
    assert set(result["methods"]) == {"via", "sd"} and all("trace" not in m for m in result["methods"].values())
    summary = result["methods"]["via"]["summary"]
    assert summary["new_tokens"] == 8 and 0 <= summary["exact_share"] <= 1 and summary["first_token_ms"] > 0
    assert all(0 <= a <= 1 for a in summary["acceptance_by_position"])
    traced = loads(traced)
    assert traced["settings"]["top_p"] == 0.9 and "trace" not in traced["methods"]["sd"]
    assert len(bare.content[0].text) * 3 < len(json.dumps(traced)), "traces only when asked for"
    estimate = loads(estimate)
    assert estimate["estimate"] is True and estimate["thresholds"]["accept"] == 0.9
    assert sum(estimate["tier_counts"].values()) == estimate["new_tokens"] > 0
    assert bad.isError and "top_p must be a number above 0" in bad.content[0].text
    fastest = THRESHOLD_PRESETS["fastest"]  # as the CLI's --thresholds fastest --accept 0.9
    assert (preset["accept"], preset["escalate"], preset["signal"]) == (0.9, fastest.escalate, fastest.signal)


def test_a_long_call_stops_and_another_connection_can_neither_see_nor_stop_it(mcp_url):
    async def exchange():
        async with connect(mcp_url) as mine, connect(mcp_url) as theirs:
            call = asyncio.create_task(mine.call_tool("compare", LONG))
            (ours,) = await running(mine)
            seen = loads(await theirs.call_tool("runs", {}))
            refused = await theirs.call_tool("stop", {"run_id": ours["run_id"]})
            nothing = loads(await theirs.call_tool("stop", {}))
            await asyncio.sleep(0.3)
            still = [r["status"] for r in loads(await mine.call_tool("runs", {}))]
            stopping = loads(await mine.call_tool("stop", {"run_id": ours["run_id"]}))
            return seen, refused, nothing, still, stopping, ours, loads(await call)

    seen, refused, nothing, still, stopping, ours, result = run(exchange())
    assert seen == [] and refused.isError and "No run" in refused.content[0].text
    assert nothing["stopping"] == [] and still == ["running"], "the other connection's stop reached nothing"
    assert stopping["stopping"] == [ours["run_id"]] and ours["tool"] == "compare"
    assert result["run_id"] == ours["run_id"] and result["status"] == "stopped"
    assert sum(m["summary"]["new_tokens"] for m in result["methods"].values()) < 2 * LONG["max_new_tokens"]


def test_a_budget_ends_a_long_call(mcp_url):
    async def exchange():
        async with connect(mcp_url) as session:
            return loads(await session.call_tool("compare", {**LONG, "budget_s": 1}))

    result = run(exchange())
    assert result["status"] == "stopped" and result["methods"]["via"]["summary"]["stopped"]


def test_bench_streams_its_progress_and_leaves_the_runs_out_unless_asked(mcp_url):
    said = []

    async def heard(progress, total, message):
        said.append(message)

    async def exchange():
        async with connect(mcp_url) as session:
            return await session.call_tool("bench", {"prompts": ["Count to five.", "Name a color."], "methods": ["sd"],
                                                     "repeats": 2, "warmup": 0, "max_new_tokens": 16,
                                                     "fidelity": False}, progress_callback=heard)

    result = loads(run(exchange()))
    assert (result["schema"], result["status"]) == ("via-sd-bench/1", "done") and "runs" not in result
    assert result["summary"]["sd"]["all"]["runs"] == 4
    # Gradio sends only the latest progress line at intervals: of four runs' lines, some arrive
    assert any(m and m.startswith("repeat ") for m in said), said


def test_sweep_answers_its_points_and_front_and_refuses_a_bad_grid_by_name(mcp_url):
    async def exchange():
        async with connect(mcp_url) as session:
            swept = await session.call_tool("sweep", {"prompts": [PROMPT], "accepts": [0.5, 0.9], "escalates": [0.1],
                                                      "repeats": 1, "warmup": 0, "max_new_tokens": 4})
            bad = await session.call_tool("sweep", {"prompts": [PROMPT], "accepts": [1.5]})
            return loads(swept), bad

    swept, bad = run(exchange())
    assert swept["status"] == "done" and "runs" not in swept
    assert [(p["accept"], p["escalate"]) for p in swept["points"]] == [(0.5, 0.1), (0.9, 0.1)]
    assert swept["frontier"] and all(p["pareto"] for p in swept["frontier"])
    assert bad.isError and "accepts must be a number from 0 to 1" in bad.content[0].text


def test_a_call_the_client_cancels_stops_its_run(mcp_url):
    from mcp import types

    async def exchange():
        async with connect(mcp_url) as session:
            short = {"prompt": PROMPT, "max_new_tokens": 4, "with_ar": False}
            loads(await session.call_tool("compare", short))  # the pair loaded and warm
            started = time.perf_counter()
            loads(await session.call_tool("compare", short))
            alone = time.perf_counter() - started
            call = asyncio.create_task(session.call_tool("compare", LONG))
            await asyncio.sleep(0.2)
            request_id = session._request_id - 1  # the id the client gave it (it numbers its requests in order)
            (ours,) = await running(session)
            await session.send_notification(types.ClientNotification(types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id, reason="the agent moved on"))))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call, 5)
            started = time.perf_counter()
            after = loads(await session.call_tool("compare", short))
            waited = time.perf_counter() - started
            listed = {r["run_id"]: r["status"] for r in loads(await session.call_tool("runs", {}))}
            return ours, after, alone, waited, listed

    ours, after, alone, waited, listed = run(exchange())
    assert listed[ours["run_id"]] == "cancelled" and after["status"] == "done"
    # one piece of model work at a time: had the cancelled run gone on (4,000 tokens), the same short call would
    # have waited for it, hundreds of times its own length
    assert waited < max(4 * alone, 8), f"the next call waited {waited:.1f} s (alone: {alone:.1f} s)"
