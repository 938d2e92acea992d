"""The app as an MCP server an agent can use, at /gradio_api/mcp/ (streamable HTTP): tools named by what they do
(`compare`, `bench`, `sweep`, `what_if_estimate`, `runs`, `stop`), results as compact JSON text.

Gradio's own MCP server is not used: it is stateless and sends every MCP call through one shared loopback client,
so all MCP clients land in one Gradio session (they read each other's runs, and Stop reaches none of them). Here
each MCP connection (its `mcp-session-id`) keeps its own runs, and each run is a loopback `gradio_client` call of
its own, so it waits in the page's queue and concurrency group like any client's and is its own Gradio session
(`studio.sessions`): `stop` ends exactly that run, and a connection sees and stops only its own runs. A long call
ends on `stop` (its run id from `runs`), on the client cancelling the request, or at its `budget_s`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import anyio
from gradio.utils import get_function_description

from via_sd import THRESHOLD_PRESETS

from . import api, batch
from .runs import NOTHING_TO_STOP
from .inputs import input_schemas

PATH = "/gradio_api/mcp"
KEEP_FINISHED = 16  # finished runs a connection still lists
MAX_CONNECTIONS = 1024  # connections remembered (the oldest forgotten first)
LANDING = "VIA-SD Studio's MCP server (streamable HTTP): connect an MCP client to this address. Tools: "
NOT_FORWARDED = {"content-length", "content-type", "host", "accept", "accept-encoding", "connection",
                 "mcp-session-id", "mcp-protocol-version", "last-event-id", "x-gradio-user"}


# ---- each connection's runs -------------------------------------------------------------------------

@dataclass
class Run:
    id: str
    tool: str
    client: object  # its own gradio_client.Client: its own Gradio session
    started: float = field(default_factory=time.time)
    status: str = "running"
    progress: str = "queued"
    job: object = None

    def view(self) -> dict:
        return {"run_id": self.id, "tool": self.tool, "status": self.status, "progress": self.progress,
                "elapsed_s": round(time.time() - self.started, 2)}


class Connections:
    """Every MCP connection's runs, by its session id. The lock guards the dict."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, dict[str, Run]] = OrderedDict()

    def add(self, connection: str, run: Run) -> None:
        with self._lock:
            runs = self._runs.setdefault(connection, {})
            self._runs.move_to_end(connection)
            while len(self._runs) > MAX_CONNECTIONS:
                self._runs.popitem(last=False)
            finished = [r.id for r in runs.values() if r.status != "running"]
            for old in finished[:max(0, len(finished) - KEEP_FINISHED + 1)]:
                runs.pop(old)
            runs[run.id] = run

    def of(self, connection: str) -> list[Run]:
        with self._lock:
            return list(self._runs.get(connection, {}).values())

    def get(self, connection: str, run_id) -> Run | None:
        with self._lock:
            return self._runs.get(connection, {}).get(run_id) if isinstance(run_id, str) else None


CONNECTIONS = Connections()


# ---- the tools --------------------------------------------------------------------------------------

def described(fn, schemas: dict, extra: dict | None = None) -> tuple[str, dict]:
    """(description, input schema) of a tool from a handler: its docstring's summary and `Args:` lines, and the
    JSON Schema of each argument (`studio.inputs`, what the handler's checks allow)."""
    summary, args, _ = get_function_description(fn)
    properties = {}
    for arg, text in args.items():
        properties[arg] = {**schemas.get(arg, {}), "description": text}
    properties.update(extra or {})
    return summary, {"type": "object", "properties": properties, "required": ["prompt"] if "prompt" in args else [],
                     "additionalProperties": False}


BUDGET = {"budget_s": {"type": "number", "exclusiveMinimum": 0,
                       "description": "stop the run after this many seconds; what it measured so far comes back"}}
WITH_RUNS = {"include_runs": {"type": "boolean", "description": "also return every timed run (long)"}}


def tool_specs() -> dict:
    """name -> (description, input schema, endpoint or None)."""
    schemas, batch_schemas = input_schemas(), batch.batch_schemas()
    traces = {"traces": {"enum": ["none", "via", "all"], "description": "which methods' whole traces to include "
                         "(via-sd-trace/1; \"via\" is what what_if_estimate takes); default none"}}
    presets = {"thresholds": {"enum": list(THRESHOLD_PRESETS), "description": "a threshold preset, as the CLI's "
                              "--thresholds: accept, escalate and signal given here override it (default: paper)"}}
    compare_text, compare_schema = described(api.compare, schemas, {**traces, **presets, **BUDGET})
    bench_text, bench_schema = described(batch.bench, batch_schemas, {**WITH_RUNS, **presets, **BUDGET})
    sweep_text, sweep_schema = described(batch.sweep, batch_schemas, {**WITH_RUNS, **BUDGET})
    for schema in (compare_schema, bench_schema, sweep_schema):
        schema["properties"].pop("preset", None)  # the served pair: loading another is the page's
    whatif_text, whatif_schema = described(api.what_if_estimate, schemas)
    whatif_schema["properties"]["trace"] = {
        "anyOf": [{"type": "object"}, {"type": "string"}],
        "description": "a VIA-SD trace: compare's methods.via.trace (with traces=\"via\"), as an object or JSON text"}
    whatif_schema["required"] = ["trace"]
    return {
        "compare": (compare_text + " Returns compact JSON text with a run_id; no traces unless asked for.",
                    compare_schema, "/compare"),
        "bench": (bench_text, bench_schema, "/bench"),
        "sweep": (sweep_text, sweep_schema, "/sweep"),
        "what_if_estimate": (whatif_text, whatif_schema, None),
        "runs": ("This connection's runs (compare, bench, sweep): each one's run_id, tool, status, progress and "
                 "elapsed seconds. Other connections' runs are never listed.",
                 {"type": "object", "properties": {}, "additionalProperties": False}, None),
        "stop": ("Stop one of this connection's runs between rounds (a run_id from `runs`; none given: all of this "
                 "connection's running work). Its call then returns what it measured, with status \"stopped\".",
                 {"type": "object", "properties": {"run_id": {"type": "string", "description": "a run_id from runs"}},
                  "additionalProperties": False}, None),
    }


def compact(value) -> str:
    """JSON text with no spaces, each number to 6 significant digits (what a measurement on a busy machine holds)."""
    return json.dumps(rounded(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


def rounded(value):
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def trimmed(tool: str, result: dict, arguments: dict) -> dict:
    """The result as the agent asked for it: traces and every run only when asked for."""
    if tool == "compare":
        keep = {"none": (), "via": ("via",), "all": tuple(result.get("methods", {}))}.get(arguments.get("traces"), ())
        for method, run in result.get("methods", {}).items():
            if method not in keep:
                run.pop("trace", None)
    elif not arguments.get("include_runs"):
        result.pop("runs", None)
    return result


# ---- the server ---------------------------------------------------------------------------------------

class Tools:
    """The MCP server's handlers for one app (`blocks`: the page they loop back to)."""

    def __init__(self, app):
        from mcp import types
        from mcp.server.lowlevel import Server

        self.app, self.types, self.specs = app, types, tool_specs()
        self.server = Server("VIA-SD Studio")
        self.server.list_tools()(self.list_tools)
        self.server.call_tool(validate_input=False)(self.call_tool)  # the handlers refuse a bad value by name

    async def list_tools(self):
        return [self.types.Tool(name=n, description=d, inputSchema=s) for n, (d, s, _) in self.specs.items()]

    def context(self):
        ctx = self.server.request_context
        request = ctx.request
        connection = request.headers.get("mcp-session-id") if request is not None else None
        return ctx, request, connection or "stateless"

    def error(self, message: str):
        return self.types.CallToolResult(content=[self.types.TextContent(type="text", text=str(message))],
                                         isError=True)

    def text(self, value):
        return self.types.CallToolResult(content=[self.types.TextContent(type="text", text=compact(value))])

    async def call_tool(self, name: str, arguments: dict):
        if name not in self.specs:
            return self.error(f"No tool named {name!r}: use one of {', '.join(self.specs)}.")
        ctx, request, connection = self.context()
        arguments = dict(arguments or {})
        try:
            if name == "runs":
                return self.text([r.view() for r in CONNECTIONS.of(connection)])
            if name == "stop":
                return self.text(await self.stop(connection, arguments.get("run_id")))
            if name == "what_if_estimate":
                paper = THRESHOLD_PRESETS["paper"]  # thresholds left out: the paper's rule, as the page starts
                given = {"trace": None, "accept": paper.accept, "escalate": paper.escalate, "signal": paper.signal}
                given.update({k: arguments[k] for k in given if k in arguments})
                unknown = sorted(set(arguments) - set(given))
                if unknown:
                    return self.error(f"what_if_estimate takes no argument named {', '.join(unknown)}.")
                return self.text(await anyio.to_thread.run_sync(lambda: api.what_if_estimate(**given)))
            return await self.work(name, arguments, ctx, request, connection)
        except Exception as err:  # a refusal (gr.Error, AppError, TypeError: an unknown argument): its message
            return self.error(getattr(err, "message", None) or str(err))

    def loopback_url(self, request) -> str:
        local = getattr(self.app.get_blocks(), "local_url", None)
        return local or str(request.base_url).split(PATH)[0].rstrip("/") + "/"

    async def work(self, name: str, arguments: dict, ctx, request, connection: str):
        """compare, bench or sweep: a loopback call of its own, registered as this connection's run."""
        from gradio_client import Client

        budget = arguments.pop("budget_s", None)
        shown = {k: arguments.pop(k) for k in ("traces", "include_runs") if k in arguments}
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
            return self.error(f"Settings: budget_s must be a number of seconds above 0, got {budget!r}.")
        if "thresholds" in arguments:  # as the CLI's --thresholds: a preset, accept/escalate/signal override it
            preset = THRESHOLD_PRESETS.get(arguments.pop("thresholds"))
            if preset is None:
                return self.error(f"Settings: thresholds must be one of {', '.join(map(repr, THRESHOLD_PRESETS))}.")
            for key in ("accept", "escalate", "signal"):
                arguments.setdefault(key, getattr(preset, key))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED} if request else {}
        url = self.loopback_url(request)
        client = await anyio.to_thread.run_sync(lambda: Client(url, verbose=False, download_files=False,
                                                               headers=headers))
        run = Run(secrets.token_hex(6), name, client)
        CONNECTIONS.add(connection, run)
        try:
            run.job = client.submit(api_name=self.specs[name][2], **arguments)
            result = await self.follow(run, ctx, budget)
            run.status = result.get("status", "done") if isinstance(result, dict) else "done"
            return self.text({"run_id": run.id, **trimmed(name, result, shown)})
        except BaseException as err:
            run.status = "error"
            if isinstance(err, anyio.get_cancelled_exc_class()):  # the client cancelled the request: stop the run
                run.status = "cancelled"
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.stop_run, run)
            raise
        finally:
            client.close()

    async def follow(self, run: Run, ctx, budget):
        """Wait for the run's result, forwarding its progress when the client asked for it; stop it at `budget`."""
        token = ctx.meta.progressToken if ctx.meta is not None else None
        step, said = 0, None

        async def at_budget():
            await anyio.sleep(max(0.0, budget - (time.time() - run.started)))
            if run.status == "running":
                run.status = "stopping"
                await anyio.to_thread.run_sync(self.stop_run, run)

        async with anyio.create_task_group() as watch:
            if budget is not None:
                watch.start_soon(at_budget)
            async for update in run.job:  # every status update of the call, none skipped
                if update.type != "status":
                    continue
                run.progress = progress_text(update)
                if token is not None and run.progress != said:
                    said, step = run.progress, step + 1
                    await ctx.session.send_progress_notification(token, step, message=said,
                                                                 related_request_id=str(ctx.request_id))
            watch.cancel_scope.cancel()
        return await anyio.to_thread.run_sync(run.job.result)

    @staticmethod
    def stop_run(run: Run, wait_s: float = 30.0) -> None:
        """/stop from the run's own Gradio session. Until its call has reached the queue, the session has nothing to
        stop: try again until it has (or it is done)."""
        deadline = time.time() + wait_s
        while NOTHING_TO_STOP in str(run.client.predict(api_name="/stop")) and time.time() < deadline:
            if run.job is not None and run.job.done():
                return
            time.sleep(0.05)

    async def stop(self, connection: str, run_id) -> dict:
        if run_id is None:
            running = [r for r in CONNECTIONS.of(connection) if r.status == "running"]
        else:
            run = CONNECTIONS.get(connection, run_id)
            if run is None:
                raise ValueError(f"No run {str(run_id)[:40]!r} of this connection: `runs` lists this connection's "
                                 "runs (another connection's cannot be seen or stopped).")
            running = [run] if run.status == "running" else []
        for run in running:
            run.status = "stopping"
            await anyio.to_thread.run_sync(self.stop_run, run)
        return {"stopping": [r.id for r in running],
                "message": "stopping after the current round" if running else "nothing of this connection is running"}


def progress_text(status) -> str:
    """A gradio_client status update in words: queued (its place), or the bench's last progress line."""
    code = getattr(getattr(status, "code", None), "name", "")
    if code == "IN_QUEUE" and status.rank is not None:
        return f"queued: {status.rank} ahead"
    for unit in reversed(getattr(status, "progress_data", None) or []):
        if unit.desc:
            return unit.desc
    return code.lower().replace("_", " ") or "running"


@contextlib.asynccontextmanager
async def lifespan(app):
    """Serve the tools at PATH of Gradio's app while it runs (`launch(app_kwargs={"lifespan": lifespan})`):
    stateful streamable HTTP, so each connection has its session id."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount

    tools = Tools(app)
    manager = StreamableHTTPSessionManager(app=tools.server, stateless=False)

    async def handle(scope, receive, send):
        accept = dict(scope.get("headers", [])).get(b"accept", b"")
        if scope.get("method") == "GET" and b"text/event-stream" not in accept:  # a browser: say what is here
            await PlainTextResponse(LANDING + ", ".join(tools.specs) + ". See docs/api.md.")(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)

    app.router.routes.insert(0, Mount(PATH, app=handle))  # before Gradio's own routes
    async with manager.run():
        yield
