"""The app's JSON endpoints, for scripts and MCP clients: a comparison's numbers and traces, and the
what-if estimate on a trace a script holds.

The page's endpoints (/run, /what_if, ...) return HTML for the page to show; these return the numbers
behind it. `compare` decodes through the page's own path (`runs.decode_comparison`), is wired into the
same queue and concurrency group as Run, and ends on the session's Stop; `what_if_estimate` passes a
trace through the engine's trace gate (`via_sd.core.trace_check`) and re-tiers it with `viz.what_if`. Bad
input raises `gr.Error` with the page's own message, which a client reads as the error's text.

Their docstrings' `Args:` lines are what an MCP client is told about each argument (one line each).
"""

from __future__ import annotations

import inspect
import json
import logging

import gradio as gr

import viz
import viz.page as page
from via_sd import Trace
from via_sd.core.trace_check import NotJSONError, TraceError, load_traces_json

from .gpu import gpu
from .inputs import KNOBS, UserError, input_schemas, make_thresholds, refuse
from .runs import decode_comparison, ending, fidelity_of, run_duration, runs_of
from .sessions import SESSIONS

log = logging.getLogger("via_sd.app")
COMPARISON_SCHEMA = "via-sd-comparison/1"
SUMMARY_KEYS = ("new_tokens", "wall_ms", "tokens_per_s", "predicted_tokens_per_s", "tier_counts", "rejection_rate",
                "verified_rejection_rate", "mean_accepted_length", "acceptance_by_position", "exact_share",
                "unverified_share", "first_token_ms", "drafted", "full_calls", "full_calls_per_token", "slim_calls",
                "prompt_tokens", "opening_tokens")
STATUS_OF_KIND = {"ok": "done", "stop": "stopped"}


# ---- a comparison as JSON -----------------------------------------------------------------------

def speedup(a, b) -> float | None:
    """a / b of two rates, None where either is missing or zero (the page's `ratio`)."""
    return page.ratio(a, b)


def method_summary(method: str, runs: dict, fidelity: dict | None) -> dict:
    """One method's numbers: the trace summary's, its speed-ups against AR and SD (measured and predicted by
    the cost profile), and the full model's agreement with its output (null for AR: it is the reference)."""
    summary = runs[method].summary or {}
    out = {key: summary.get(key) for key in SUMMARY_KEYS}
    for base in ("ar", "sd"):
        other = (runs[base].summary or {}) if base in runs else {}
        out[f"speedup_vs_{base}"] = speedup(summary.get("tokens_per_s"), other.get("tokens_per_s"))
        out[f"predicted_speedup_vs_{base}"] = speedup(summary.get("predicted_tokens_per_s"),
                                                      other.get("predicted_tokens_per_s"))
    scored = (fidelity or {}).get(method) or {}
    out["agreement"] = scored.get("agreement")
    out["mean_logprob"] = scored.get("mean_logprob")
    out["stopped"] = bool(summary.get("stopped"))
    return out


def comparison_json(traces: dict, settings: dict, status: str, message: str, fidelity: dict | None) -> dict:
    """The comparison a client reads: per method its summary, text and whole trace (schema via-sd-trace/1),
    the measured speed-ups, the full model's agreement, and the cost profile the run was decided and priced with."""
    runs = runs_of(traces)
    methods = {m: {"text": t.text, "summary": method_summary(m, runs, fidelity), "trace": t.to_dict()}
               for m, t in runs.items()}
    tps = {m: (t.summary or {}).get("tokens_per_s") for m, t in runs.items()}
    speedups = {f"{a}_vs_{b}": speedup(tps.get(a), tps.get(b)) for a, b in (("via", "ar"), ("via", "sd"), ("sd", "ar"))
                if a in runs and b in runs}
    profile = next((t.costs for t in runs.values() if getattr(t, "costs", None)), None)
    return {"schema": COMPARISON_SCHEMA, "status": status, "message": message, "preset": traces.get("preset"),
            "settings": settings, "methods": methods, "speedups": speedups,
            "fidelity": fidelity if fidelity else {"note": "not measured (no finished VIA-SD or SD output)"},
            "cost_profile": profile}


@gpu(duration=run_duration)
def compare(prompt, preset, gamma, accept, escalate, signal, temperature, max_new_tokens, seed, route,
            with_ar=True, drafter="model", top_p=KNOBS["top_p"], draft_stop=KNOBS["draft_stop"],
            max_unverified=KNOBS["max_unverified"], chat=KNOBS["chat"], lookup_ngram=KNOBS["lookup_ngram"],
            lookup_tokens=KNOBS["lookup_tokens"], exit_layer=KNOBS["exit_layer"], request: gr.Request = None,
            progress=gr.Progress()) -> dict:
    """Decode one prompt with VIA-SD, then plain speculative decoding (SD), then (with_ar) autoregressive decoding
    (AR) on the same models, and return the numbers as JSON: per method its summary (tokens/s, predicted tokens/s,
    speed-up against AR and SD, tier counts, rejection rates, mean accepted length, acceptance by draft position,
    exact share, time to the first decided token, full-model calls, the full model's agreement), its text and its
    whole trace (schema via-sd-trace/1), plus the measured speed-ups and the cost profile used. Every setting of
    `via_sd generate` is here, with its defaults. Stop (/stop) ends it between rounds: partial traces come back with status "stopped".

    Args:
        prompt: the text to continue (a chat prompt: the chat template is applied)
        preset: the model pair to decode with, one of the "Model preset" choices (default: the served pair)
        gamma: drafts per round, a whole number; 0 or "auto" lets the engine pick each round's from this machine's costs
        accept: tier A threshold in [0, 1]: a draft with confidence >= accept is kept with no verifier
        escalate: tier C threshold in [0, accept]: a draft with confidence < escalate goes to the full model
        signal: whose confidence sorts the tiers: "slim" (the slim verifier, the paper's rule) or "draft"
        temperature: sampling temperature; 0 decodes greedily
        max_new_tokens: the most tokens each method emits
        seed: the random seed (a whole number >= 0), the same for every method
        route: the slim verifier's route (which sub-layers it skips); "default" is the pair's own
        with_ar: also decode with the full model alone (AR), the baseline of the speed-ups against AR
        drafter: who proposes the drafts: "model" (the pair's drafter), "lookup" (prompt lookup), "hybrid" (lookup
            when it matches, else the model) or "early-exit" (the verifier's first layers)
        top_p: nucleus sampling: sample among the most likely tokens whose probabilities sum to top_p (0 < top_p <= 1)
        draft_stop: end a round's drafting once the drafter's p(x) falls below this, in [0, 1] (0: never)
        max_unverified: send a round to a verifier after this many tokens in a row kept with none (0: no bound)
        chat: apply the tokenizer's chat template to the prompt (false: continue the raw text)
        lookup_ngram: prompt lookup: the longest n-gram matched (1 to 16)
        lookup_tokens: prompt lookup: the most tokens one match drafts (1 to 64)
        exit_layer: early exit: the verifier's layers that draft (0: half of them)
    """
    job = SESSIONS.get(request).job("run")
    knobs = {"top_p": top_p, "draft_stop": draft_stop, "max_unverified": max_unverified, "chat": chat,
             "lookup_ngram": lookup_ngram, "lookup_tokens": lookup_tokens, "exit_layer": exit_layer}
    settings = {"prompt": prompt, "gamma": gamma, "accept": accept, "escalate": escalate, "signal": signal,
                "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed, "route": route,
                "with_ar": with_ar, "drafter": drafter, **knobs}
    traces: dict = {"ticket": job.ticket, "preset": preset}
    if job.is_set():  # Stop pressed while this call waited in the queue
        return comparison_json(traces, settings, "stopped", "Stopped before it started (Stop was pressed while the "
                               "comparison waited in the queue).", None)
    try:
        for _ in decode_comparison(job, traces, prompt, preset, gamma, accept, escalate, signal, temperature,
                                   max_new_tokens, seed, route, with_ar, progress, drafter=drafter, **knobs):
            pass
        message, kind = ending(job, traces)
        fidelity = None if job.is_set() else fidelity_of(traces, stop=job.is_set)
    except ValueError as err:  # UserError, or the engine refusing an input: the page's message
        raise refuse(str(err)) from None
    except Exception as err:  # never a stack trace to the client; the log keeps it
        log.exception("comparison failed")
        raise refuse(f"Something went wrong: {type(err).__name__}: {err}") from None
    status = "superseded" if job.superseded else STATUS_OF_KIND.get(kind, kind)
    return comparison_json(traces, settings, status, message, fidelity)


def compare_schema() -> dict:
    """`compare`'s inputs as JSON Schema (docs/api.md): its arguments by name, in order, with what the checks of
    `studio.inputs` allow. A client may leave out all but the prompt: each takes the page's setting."""
    args = [p.name for p in inspect.signature(compare).parameters.values() if p.name not in ("request", "progress")]
    schemas = input_schemas()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "/compare inputs",
            "description": "gradio_client: client.predict(*values, api_name='/compare') in this order, or by name; "
                           "one left out takes the page's setting (client.view_api() lists them)",
            "type": "object", "properties": {name: schemas[name] for name in args}, "required": ["prompt"],
            "additionalProperties": False}


# ---- the what-if estimate on a trace from outside ---------------------------------------------------

def trace_text(trace) -> str:
    """The JSON text of the trace a client sent (the endpoint's input is text: the gate checks its size and depth
    before parsing it, as for an uploaded file). A direct call from Python may pass the trace's dict instead."""
    if trace is None or (isinstance(trace, str) and not trace.strip()):
        raise UserError("No trace: pass a VIA-SD trace's JSON text (schema via-sd-trace/1), e.g. "
                        "json.dumps(comparison['methods']['via']['trace']) or a trace file saved by the app.")
    if isinstance(trace, str):
        return trace
    try:
        return json.dumps(trace, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as err:
        raise UserError(f"not a VIA-SD trace: it is not plain JSON ({str(err)[:120]})") from None


def via_trace(trace) -> Trace:
    """The VIA-SD trace among what the client sent, past the engine's gate (every field checked)."""
    try:
        items = load_traces_json(trace_text(trace))
    except NotJSONError as err:
        raise UserError(f"{err}: pass the trace as JSON text, e.g. json.dumps(trace)") from None
    except TraceError as err:
        raise UserError(str(err)) from None
    via = [item for item in items if item.get("method") == "via"]
    if not via:
        found = ", ".join(sorted({str(item.get("method")) for item in items}))
        raise UserError(f"The what-if re-tiers a VIA-SD trace (method \"via\"); this holds {found}.")
    return Trace.from_dict(via[0])


def what_if_estimate(trace, accept, escalate, signal) -> dict:
    """Re-tier a recorded VIA-SD trace under new thresholds and return the ESTIMATE as JSON: tier counts, slim and
    full verifier calls, rejection rate, mean accepted length, tokens/s and speed-up against the recording. Nothing
    is re-run: the recorded drafts are sorted again, so the result says "estimate": true, carries a label, and notes
    what was guessed.

    Args:
        trace: the JSON text of a VIA-SD trace (via-sd-trace/1): a compare result's methods.via.trace, or a saved file
        accept: the new tier A threshold in [0, 1]: drafts with confidence >= accept are kept with no verifier
        escalate: the new tier C threshold in [0, accept]: drafts with confidence < escalate go to the full model
        signal: whose confidence sorts the tiers: "slim" (the slim verifier, the paper's rule) or "draft"
    """
    try:
        recorded = via_trace(trace)
        thresholds = make_thresholds(accept, escalate, signal)
    except UserError as err:
        raise refuse(str(err)) from None
    try:
        return viz.what_if(recorded, thresholds)
    except Exception as err:  # the gate passed it, yet it does not replay: say so, no stack trace
        raise refuse(f"not a VIA-SD trace: its contents do not fit the trace schema ({type(err).__name__}: "
                     f"{str(err)[:200]})") from None
