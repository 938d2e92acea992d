"""docs/api.md publishes JSON Schemas of /compare's inputs and of a trace (via-sd-trace/1), written from the code
(scripts/api_schema.py): the doc shows what the code writes, and each schema refuses exactly what its check refuses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from studio.api import compare_schema
from studio.batch import bench, bench_settings, endpoint_schema, sweep, sweep_settings
from studio.inputs import UserError
from studio.runs import decode_comparison
from via_sd import DecodeConfig, Thresholds, generate
from via_sd.core.trace_check import TraceError, check_trace, json_schema

jsonschema = pytest.importorskip("jsonschema")  # with `mcp` (requirements.txt)

ROOT = Path(__file__).resolve().parents[1]
REFRESH = ".venv/bin/python scripts/api_schema.py"
# accept 1 and escalate 0: any one threshold in [0, 1] keeps them in order (a rule the schema states in words only)
COMPARE = dict(prompt="Write a haiku.", preset="random", gamma=4, accept=1.0, escalate=0.0, signal="slim",
               temperature=0.0, max_new_tokens=8, seed=0, route="default", with_ar=False, drafter="model", top_p=1.0,
               draft_stop=0.0, max_unverified=32, chat=True, lookup_ngram=3, lookup_tokens=10, exit_layer=0)
HOSTILE = [None, True, "", " ", "abc", "auto", "slim", "lookup", -1, 0, 1, 1.5, 7, 2**40, 1e300, [], {}, ["attn.1"], [1],
           "x" * 7000]


def script():
    spec = importlib.util.spec_from_file_location("api_schema", ROOT / "scripts" / "api_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_api_md_shows_the_schemas_the_code_writes():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert script().refreshed(text) == text, f"docs/api.md's JSON Schemas are stale: run `{REFRESH}`"


def refused_by_compare(settings: dict) -> bool:
    """Does /compare refuse these settings? Its checks run before the models are touched (the first step)."""
    try:
        next(decode_comparison(None, {}, **settings))
    except UserError:
        return True
    return False


def test_the_compare_schema_refuses_exactly_what_compare_refuses():
    schema = jsonschema.Draft202012Validator(compare_schema())
    assert list(schema.schema["properties"]) == list(COMPARE), "the schema names /compare's arguments in order"
    assert schema.is_valid(COMPARE) and not refused_by_compare(COMPARE)
    for field in COMPARE:
        for value in HOSTILE:
            settings = {**COMPARE, field: value}
            assert schema.is_valid(settings) != refused_by_compare(settings), f"{field}={str(value)[:20]!r}"


KNOBS = {k: COMPARE[k] for k in ("top_p", "draft_stop", "max_unverified", "chat", "lookup_ngram", "lookup_tokens",
                                  "exit_layer")}
DECODING = dict(preset="random", gamma=4, signal="slim", temperature=0.0, max_new_tokens=8, seed=0, route="default",
                drafter="model", **KNOBS)
BENCH = dict(prompts=["Write a haiku."], methods=["sd", "via"], repeats=1, warmup=0, fidelity=True, limit=0,
             accept=1.0, escalate=0.0, **DECODING)
SWEEP = dict(prompts=["Write a haiku."], accepts=[1.0], escalates=[0.0], repeats=1, warmup=0, limit=0, **DECODING)
BATCH_HOSTILE = HOSTILE + ["mixed", "mixed.jsonl", " mixed", "../mixed", 20, 21, 64, 65, ["sd", "sd"], ["via", 1],
                           [0.5, 2], [0.0, 0.2], [{"prompt": "Hi"}], [{"task": "qa", "prompt": "Hi"}], [{"task": "qa"}],
                           [{"prompt": "Hi", "x": 1}], [{"task": " ", "prompt": "Hi"}], [[]], ["Hi"] * 65]


def refused(check, settings: dict) -> bool:
    try:
        check(**settings)
    except UserError:
        return True
    return False


@pytest.mark.parametrize("endpoint, base", [(bench, BENCH), (sweep, SWEEP)], ids=["bench", "sweep"])
def test_the_batch_schemas_refuse_exactly_what_bench_and_sweep_refuse(endpoint, base):
    schema = jsonschema.Draft202012Validator(endpoint_schema(endpoint, "inputs"))
    check = bench_settings if endpoint is bench else sweep_settings
    assert set(schema.schema["properties"]) == set(base), "the schema names the endpoint's arguments"
    assert schema.is_valid(base) and not refused(check, base)
    for field in base:
        for value in BATCH_HOSTILE:
            settings = {**base, field: value}
            assert schema.is_valid(settings) != refused(check, settings), f"{field}={str(value)[:20]!r}"


@pytest.fixture(scope="module")
def traces(tiny_routed_pair) -> list[dict]:
    config = DecodeConfig(gamma=4, max_new_tokens=24, seed=0, thresholds=Thresholds(accept=0.6, escalate=0.2))
    return [generate(tiny_routed_pair, "Write a haiku.", m, config).to_dict() for m in ("via", "sd", "ar")]


def named_fields(trace: dict, schema: dict):
    """(object, key) of every field the schema names, in the trace, its config, thresholds, models, summary, tier
    counts, first token, a round, its first candidate and call (keys it does not name are plain JSON: words only)."""
    defs = schema["$defs"]
    first_round = next(r for r in trace["rounds"] if r.get("calls"))
    for obj, named in [(trace, schema), (trace["config"], defs["config"]), (trace["config"]["thresholds"],
                       defs["thresholds"]), (trace["models"], defs["models"]), (trace["summary"], defs["summary"]),
                       (trace["summary"]["tier_counts"], defs["summary"]["properties"]["tier_counts"]),
                       (trace["tokens"][0], defs["token"]), (first_round, defs["round"]),
                       (first_round["candidates"][0], defs["candidate"]), (first_round["calls"][0], defs["call"])]:
        yield from ((obj, key) for key in list(obj) if key in named["properties"])


def test_real_traces_fit_the_trace_schema_and_it_refuses_what_the_gate_refuses(traces):
    schema = jsonschema.Draft202012Validator(json_schema())
    jsonschema.Draft202012Validator.check_schema(schema.schema)
    for trace in traces:
        assert schema.is_valid(trace), f"{trace['method']}: {next(schema.iter_errors(trace)).message}"
    via = traces[0]  # an SD or AR trace has the same fields or a subset of them
    via.update(tokens=via["tokens"][:1], rounds=[next(r for r in via["rounds"] if r.get("calls"))])  # one of each
    via["config"]["thresholds"].update(accept=1.0, escalate=0.0)  # in order whatever one of them becomes
    for obj, key in named_fields(via, schema.schema):
        kept = obj[key]
        for value in HOSTILE[:-1]:
            obj[key] = value
            try:
                check_trace(via)
                gate = False
            except TraceError:
                gate = True
            assert schema.is_valid(via) != gate, f"{key}={str(value)[:20]!r}"
        obj[key] = kept
    assert json.dumps(json_schema())  # plain JSON
