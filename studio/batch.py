"""The batch endpoints: `/bench` (prompts x methods x repeats, the CLI bench's JSON) and `/sweep` (VIA-SD over a
threshold grid against plain SD: its points and Pareto front as JSON). Both call the bench itself (`via_sd.bench`),
wait in the same queue and concurrency group as Run, stream their progress (gr.Progress), and end on the session's
Stop between runs. Every setting is checked by name, as /compare's are (`studio.inputs`).
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path

import gradio as gr

from via_sd.bench.inputs import load_prompts
from via_sd.bench.methods import BENCH_METHODS, SCHEMA

from .engine import run_bench, run_sweep
from .gpu import gpu
from .inputs import (MAX_GRID, Bound, UserError, check_prompt, choice, flag, grid_size, input_schemas, make_config,
                     name, number, refuse, shown)
from .inputs import route as check_route
from .models import MODELS
from .sessions import SESSIONS

log = logging.getLogger("via_sd.app")
PROMPT_FILES = Path(__file__).resolve().parent.parent / "assets" / "prompts"
MAX_PROMPTS = 64  # prompts in one batch
MAX_RUNS = 512  # timed runs in one batch: prompts x methods (or grid points + plain SD) x repeats
REPEATS, WARMUP, LIMIT = Bound(True, 1, 20), Bound(True, 0, 5), Bound(True, 0, MAX_PROMPTS)
# what a client that leaves them out gets (the CLI's, but the methods: ours that need no extra package, no hf)
BATCH = {"prompts": "mixed", "methods": ["ar", "sd", "via"], "repeats": 3, "warmup": 1, "fidelity": True, "limit": 0,
         "accepts": [0.3, 0.6, 0.9], "escalates": [0.0, 0.2]}


class Stopped(Exception):
    """Stop (or a newer batch of the session) reached the bench between two runs."""


def prompt_files() -> list[str]:
    """The shipped prompt files a batch may name (assets/prompts/*.jsonl), without their suffix."""
    return sorted(p.stem for p in PROMPT_FILES.glob("*.jsonl"))


def check_prompts(prompts, limit=0) -> list[dict]:
    """[{task, prompt}] from a list (texts or {"task", "prompt"} objects) or a shipped prompt file's name
    ("mixed" or "mixed.jsonl"), the first `limit` of them (0: all), or UserError naming `prompts`."""
    limit = number("limit", limit, LIMIT)
    if isinstance(prompts, str):
        stem = prompts.removesuffix(".jsonl")
        if stem not in prompt_files():
            raise UserError(f"Settings: prompts names no shipped prompt file: {shown(prompts)}; pass a list of prompts "
                            f"or one of {', '.join(prompt_files())}.")
        items = load_prompts(PROMPT_FILES / f"{stem}.jsonl")
        items = [{"task": p["task"], "prompt": p["prompt"]} for p in items]
    elif isinstance(prompts, list) and 0 < len(prompts) <= MAX_PROMPTS:
        items = []
        for k, p in enumerate(prompts):
            if isinstance(p, dict) and set(p) <= {"task", "prompt"} and "prompt" in p:
                task, text = p.get("task", "default"), p.get("prompt")
            else:
                task, text = "default", p
            try:
                items.append({"task": name(f"prompts[{k}].task", task), "prompt": check_prompt(text)})
            except UserError as err:
                raise UserError(f"Settings: prompts[{k}]: {err}") from None
    else:
        raise UserError(f"Settings: prompts must be a list of 1 to {MAX_PROMPTS} prompts (texts or "
                        f"{{\"task\", \"prompt\"}} objects) or a shipped prompt file's name, got {shown(prompts)}.")
    return items[:limit] if limit else items[:MAX_PROMPTS]


def check_methods(methods) -> list[str]:
    """A list of bench methods, each one of BENCH_METHODS."""
    if not isinstance(methods, list) or not 0 < len(methods) <= len(BENCH_METHODS):
        raise UserError(f"Settings: methods must be a list of 1 to {len(BENCH_METHODS)} of "
                        f"{', '.join(BENCH_METHODS)}, got {shown(methods)}.")
    return list(dict.fromkeys(choice("methods", m, BENCH_METHODS) for m in methods))


def check_grid(values, field: str) -> list[float]:
    """A sweep's accept or escalate values: a list of 1 to MAX_GRID numbers in [0, 1]."""
    if not isinstance(values, list) or not 0 < len(values) <= MAX_GRID:
        raise UserError(f"Settings: {field} must be a list of 1 to {MAX_GRID} numbers from 0 to 1, got "
                        f"{shown(values)}.")
    return sorted({round(number(field, v, Bound(False, 0.0, 1.0)), 4) for v in values})


def batch_schemas() -> dict:
    """What the checks above allow of each batch argument, as JSON Schema (docs/api.md, the MCP tools)."""
    schemas = input_schemas()
    prompt = {"anyOf": [schemas["prompt"], {"type": "object", "properties": {"task": schemas["preset"],
                                                                                "prompt": schemas["prompt"]},
                                               "required": ["prompt"], "additionalProperties": False}]}
    files = prompt_files()
    grid = {"type": "array", "minItems": 1, "maxItems": MAX_GRID, "items": {"type": "number", "minimum": 0,
                                                                            "maximum": 1}}
    return {**schemas,
            "prompts": {"anyOf": [{"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": prompt},
                                  {"enum": files + [f"{f}.jsonl" for f in files]}],
                        "description": f"a shipped file's prompts: at most {MAX_PROMPTS} (limit: fewer)"},
            "methods": {"type": "array", "minItems": 1, "maxItems": len(BENCH_METHODS),
                        "items": {"enum": list(BENCH_METHODS)}},
            "repeats": {**REPEATS.json_schema(), "description": f"at most {MAX_RUNS} timed runs in all"},
            "warmup": WARMUP.json_schema(), "fidelity": {"type": "boolean"}, "limit": LIMIT.json_schema(),
            "accepts": grid, "escalates": {**grid, "description": f"at most {MAX_GRID} (accept, escalate) points "
                                           "with escalate <= accept, and at least one"}}


def endpoint_schema(fn, title: str) -> dict:
    """An endpoint's inputs as JSON Schema: its arguments by name, in order (`batch_schemas`)."""
    args = [p.name for p in inspect.signature(fn).parameters.values() if p.name not in ("request", "progress")]
    schemas = batch_schemas()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
            "description": f"gradio_client: client.predict(..., api_name='/{fn.__name__}') by name; one left out takes "
                           "its default (client.view_api() lists them)",
            "type": "object", "properties": {name: schemas[name] for name in args}, "required": ["prompts"],
            "additionalProperties": False}


def reporter(job, progress):
    """The bench's progress callback: the message to the client's progress, and Stop checked after every run."""
    def report(message, fraction):
        if progress is not None:
            progress(min(max(float(fraction), 0.0), 1.0), desc=message)
        if job.is_set():
            raise Stopped
    return report


def stopped_json(kind: str, job) -> dict:
    """What a batch stopped before it had numbers returns."""
    why = "a newer one of this session replaced it" if job.superseded else "Stop was pressed"
    if kind == "bench":
        message = f"Stopped ({why}): a stopped bench returns no numbers (its medians need every run)."
    else:
        message = f"Stopped ({why}) before plain SD was measured: nothing to compare with."
    return {"schema": SCHEMA, "kind": kind, "status": "stopped", "message": message}


def pair_for(preset, route, progress):
    preset, route = name("preset", preset), check_route(route)
    return MODELS.view(MODELS.wait(preset, progress), preset, route)


def decoding(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter, knobs: dict):
    return make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter, **knobs)


def bench_settings(prompts, methods, repeats, warmup, fidelity, limit, preset, gamma, accept, escalate, signal,
                   temperature, max_new_tokens, seed, route, drafter="model", **knobs) -> dict:
    """/bench's arguments checked (UserError naming the first bad one): run_bench's keywords, the preset and route."""
    items, methods = check_prompts(prompts, limit), check_methods(methods)
    repeats, warmup = number("repeats", repeats, REPEATS), number("warmup", warmup, WARMUP)
    runs = len(items) * len(methods) * repeats
    if runs > MAX_RUNS:
        raise UserError(f"Settings: {runs:,} timed runs (prompts x methods x repeats); keep it to {MAX_RUNS}.")
    config = decoding(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter, knobs)
    return {"prompts": items, "methods": methods, "repeats": repeats, "warmup": warmup,
            "fidelity": flag("fidelity", fidelity), "config": config, "preset": name("preset", preset),
            "route": check_route(route)}


def sweep_settings(prompts, accepts, escalates, repeats, warmup, limit, preset, gamma, signal, temperature,
                   max_new_tokens, seed, route, drafter="model", **knobs) -> dict:
    """/sweep's arguments checked (UserError naming the first bad one): run_sweep's keywords, the preset and route."""
    items = check_prompts(prompts, limit)
    accept, escalate = check_grid(accepts, "accepts"), check_grid(escalates, "escalates")
    size = grid_size(accept, escalate)
    if not size:
        raise UserError("Settings: no (accept, escalate) pair of the grid has escalate <= accept.")
    if size > MAX_GRID:
        raise UserError(f"Settings: the grid has {size:,} settings; keep it to {MAX_GRID} or fewer.")
    repeats, warmup = number("repeats", repeats, REPEATS), number("warmup", warmup, WARMUP)
    if len(items) * (size + 1) * repeats > MAX_RUNS:
        raise UserError(f"Settings: {len(items) * (size + 1) * repeats:,} timed runs (prompts x (grid points + "
                        f"plain SD) x repeats); keep it to {MAX_RUNS}.")
    config = decoding(gamma, 1.0, 0.0, signal, temperature, max_new_tokens, seed, drafter, knobs)
    return {"prompts": items, "accept": accept, "escalate": escalate, "signals": [config.thresholds.signal],
            "repeats": repeats, "warmup": warmup, "config": config, "preset": name("preset", preset),
            "route": check_route(route)}


def batch(kind: str, fn, settings: dict, request, progress) -> dict:
    """Run `fn` (run_bench or run_sweep) as this session's work: Stop ends it between runs."""
    job = SESSIONS.get(request).job(kind)
    try:
        checked = (bench_settings if kind == "bench" else sweep_settings)(**settings)
        if job.is_set():
            return stopped_json(kind, job)
        pair = pair_for(checked.pop("preset"), checked.pop("route"), progress)
        started = time.time()
        if kind == "bench":
            result = fn(pair, checked.pop("prompts"), progress=reporter(job, progress), **checked)
        else:  # the sweep checks `stop` between runs itself and keeps what it measured
            result = fn(pair, checked.pop("prompts"), progress=reporter(_Never(), progress), stop=job, **checked)
    except Stopped:
        return stopped_json(kind, job)
    except ValueError as err:  # UserError, or the bench refusing an input
        raise refuse(err) from None
    except Exception as err:
        log.exception("%s failed", kind)
        raise refuse(f"Something went wrong: {type(err).__name__}: {err}") from None
    if result.get("sd", True) is None:  # a sweep stopped before its baseline ran
        return stopped_json(kind, job)
    return {**result, "status": "stopped" if result.get("stopped") else "done", "elapsed_s": time.time() - started}


@gpu(duration=300)
def bench(prompts, methods, repeats, warmup, fidelity, limit, preset, gamma, accept, escalate, signal, temperature,
          max_new_tokens, seed, route, drafter="model", top_p=1.0, draft_stop=0.0, max_unverified=32, chat=True,
          lookup_ngram=3, lookup_tokens=10, exit_layer=0, request: gr.Request = None, progress=gr.Progress()) -> dict:
    """Benchmark methods over prompts, each prompt and method `repeats` times, interleaved after a warm-up, as
    `python -m via_sd bench` does, and return its JSON (schema via-sd-bench/1: every timed run, then per method the
    median tokens/s, paired speed-ups against AR and SD, acceptance, fidelity). Progress streams after every run;
    Stop (/stop) ends it between runs.

    Args:
        prompts: a list of prompts (texts, or {"task", "prompt"} objects) or a shipped prompt file's name ("mixed", "code", ...)
        methods: which methods to time: a list from ar, sd, via, hf, sd-lookup, via-lookup, ... (default ar, sd, via)
        repeats: runs of each prompt and method (1 to 20)
        warmup: untimed warm-up rounds of every method first (0 to 5)
        fidelity: also score every output with the full model (agreement, log-prob)
        limit: only the first N prompts (0: all)
        preset: the model pair, one of the "Model preset" choices (default: the served pair)
        gamma: drafts per round, a whole number; 0 or "auto" picks each round's from this machine's costs
        accept: tier A threshold in [0, 1]
        escalate: tier C threshold in [0, accept]
        signal: whose confidence sorts the tiers: "slim" or "draft"
        temperature: sampling temperature; 0 decodes greedily
        max_new_tokens: the most tokens each run emits
        seed: the random seed (a whole number >= 0)
        route: the slim verifier's route; "default" is the pair's own
        drafter: who drafts for sd and via: "model", "lookup", "hybrid" or "early-exit"
        top_p: nucleus sampling (0 < top_p <= 1)
        draft_stop: end a round's drafting once the drafter's p(x) falls below this (0: never)
        max_unverified: send a round to a verifier after this many unverified tokens in a row (0: no bound)
        chat: apply the chat template
        lookup_ngram: prompt lookup: the longest n-gram matched
        lookup_tokens: prompt lookup: the most tokens one match drafts
        exit_layer: early exit: the verifier's layers that draft (0: half)
    """
    settings = {k: v for k, v in locals().items() if k not in ("request", "progress")}
    return batch("bench", run_bench, settings, request, progress)


@gpu(duration=300)
def sweep(prompts, accepts, escalates, repeats, warmup, limit, preset, gamma, signal, temperature, max_new_tokens,
          seed, route, drafter="model", top_p=1.0, draft_stop=0.0, max_unverified=32, chat=True, lookup_ngram=3,
          lookup_tokens=10, exit_layer=0, request: gr.Request = None, progress=gr.Progress()) -> dict:
    """Measure VIA-SD at every (accept, escalate) of a grid (escalate <= accept) and plain SD on the same prompts,
    interleaved, and return the points (speed-up against plain SD, fidelity: the full model's top-1 agreement, tier
    shares), the Pareto front (`frontier`), the fastest point with agreement >= 0.95 (`best`) and every run, as JSON.
    Stop (/stop) ends it between runs; the points measured so far come back with "stopped": true.

    Args:
        prompts: a list of prompts (texts, or {"task", "prompt"} objects) or a shipped prompt file's name
        accepts: the tier A thresholds to try: a list of numbers in [0, 1]
        escalates: the tier C thresholds to try: a list of numbers in [0, 1] (each point keeps escalate <= accept)
        repeats: runs of each prompt and point (1 to 20)
        warmup: untimed warm-up rounds first (0 to 5)
        limit: only the first N prompts (0: all)
        preset: the model pair, one of the "Model preset" choices (default: the served pair)
        gamma: drafts per round; 0 or "auto" picks each round's from this machine's costs
        signal: whose confidence sorts the tiers: "slim" or "draft"
        temperature: sampling temperature; 0 decodes greedily
        max_new_tokens: the most tokens each run emits
        seed: the random seed
        route: the slim verifier's route; "default" is the pair's own
        drafter: who drafts: "model", "lookup", "hybrid" or "early-exit"
        top_p: nucleus sampling (0 < top_p <= 1)
        draft_stop: end a round's drafting once the drafter's p(x) falls below this (0: never)
        max_unverified: send a round to a verifier after this many unverified tokens in a row (0: no bound)
        chat: apply the chat template
        lookup_ngram: prompt lookup: the longest n-gram matched
        lookup_tokens: prompt lookup: the most tokens one match drafts
        exit_layer: early exit: the verifier's layers that draft (0: half)
    """
    settings = {k: v for k, v in locals().items() if k not in ("request", "progress")}
    return batch("sweep", run_sweep, settings, request, progress)


class _Never:
    """The sweep checks its own `stop` between runs and keeps what it measured: its progress never raises."""

    def is_set(self) -> bool:
        return False
