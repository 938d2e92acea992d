"""Same traces before and after a refactor of the engine: records every method and drafter kind on the random pair
(greedy and sampled, gamma auto and fixed, VIA-SD's variants; and with --embedded six short runs on the embedded
pair) under a fixed cost profile, with the events stream_events yields, and compares two recordings field by field
(timing fields excluded). Run the record step from a checkout of each commit:

    PYTHONPATH=. .venv/bin/python scripts/trace_parity.py record /tmp/before [--embedded]   # at the old commit
    PYTHONPATH=. .venv/bin/python scripts/trace_parity.py record /tmp/after [--embedded]    # at the new one
    PYTHONPATH=. .venv/bin/python scripts/trace_parity.py compare /tmp/before /tmp/after    # exit 1 if any differ
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TIMING = {"start_ms", "draft_ms", "slim_ms", "full_ms", "other_ms", "wall_ms", "tokens_per_s", "prefill_ms",
          "first_token_ms", "ms"}  # "ms": a recorded forward's own time
PROMPTS = ["abcabcabc the cat sat on the mat; the cat sat on the", "hello world, hello world, hello there"]


def cases():
    from via_sd import DecodeConfig, Thresholds

    out = []
    for drafter in ("model", "lookup", "hybrid", "early-exit"):
        for method in ("ar", "sd", "via"):
            for gamma in ("auto", 4):
                for temp in (0.0, 0.8):
                    if method == "ar" and (drafter != "model" or gamma != "auto"):
                        continue
                    out.append((method, dict(drafter=drafter, gamma=gamma, temperature=temp, seed=3)))
    for drafter in ("model", "early-exit"):  # VIA-SD's variants
        for th in ("fastest", "lossless"):
            for gamma in ("auto", 5):
                out.append(("via", dict(drafter=drafter, gamma=gamma, thresholds=Thresholds.preset(th))))
        out.append(("via", dict(drafter=drafter, progressive=False)))
        out.append(("via", dict(drafter=drafter, slim_cache="own", temperature=0.7, seed=5)))
        out.append(("via", dict(drafter=drafter, gamma=6, max_unverified=4,
                                thresholds=Thresholds(accept=0.0, escalate=0.0, signal="draft"))))
        out.append(("via", dict(drafter=drafter, draft_stop=0.5, gamma=6)))
        out.append(("sd", dict(drafter=drafter, draft_stop=0.5, gamma=6, top_p=0.9, temperature=1.0)))
    for drafter in ("lookup", "hybrid"):
        out.append(("via", dict(drafter=drafter, progressive=False, temperature=0.5, seed=1)))
        out.append(("via", dict(drafter=drafter, thresholds=Thresholds(accept=1.0, escalate=1.0))))
        out.append(("via", dict(drafter=drafter, thresholds=Thresholds(accept=0.9, escalate=0.2), gamma=5)))
        out.append(("sd", dict(drafter=drafter, lookup_ngram=2, lookup_tokens=6)))
    return [(m, DecodeConfig(**{"max_new_tokens": 40, **kw})) for m, kw in out]


def fix_costs(pair):
    """A fixed cost profile, prompt lookup's and the early exit's cost fixed too: gamma="auto" decides the same."""
    from via_sd.cost.model import CostProfile
    from via_sd.core import early_exit, profile

    ks = range(1, 18)
    prof = CostProfile(tuple(10.0 + 0.9 * k for k in ks), tuple(6.0 + 0.5 * k for k in ks),
                       tuple(5.0 + 0.6 * k for k in ks), (2.0, 2.3, 2.6),
                       {"drafter": {32: 20.0, 128: 60.0}, "full": {32: 50.0, 128: 150.0}},
                       {"route": list(pair.route.skip)}, "fixed")
    pair._costs = prof
    for name in ("via_sd.core.lookup", "via_sd.core.drafters"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "_LOOKUP_MS"):
            for ng in range(1, 8):
                for tok in range(1, 20):
                    mod._LOOKUP_MS[(ng, tok)] = 0.01
    n = pair.verifier.config.num_hidden_layers
    for layer in range(1, n):
        key = {**profile.profile_key(pair), "drafter": f"early-exit-{layer}", "verify_ms": round(prof.verify(1), 3)}
        early_exit._MEASURED[profile.profile_path(key)] = (3.0, 3.4, 3.8)


def run(pair, method, config, prompt):
    from via_sd.core.decoding import stream_events

    events = []
    for ev in stream_events(pair, prompt, method, config):
        events.append({"kind": ev.kind, "round": ev.round,
                       "candidates": [{k: c.get(k) for k in ("tier", "decision")} for c in ev.candidates]})
    trace = ev.trace.to_dict()
    trace["events"] = events
    return trace


def record(out: Path, embedded: bool, limit: int = 0):
    import torch
    from via_sd import load_pair, tiny_random_pair

    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    pair = tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])
    fix_costs(pair)
    traces = []
    for method, config in cases()[:limit or None]:
        for prompt in PROMPTS:
            traces.append(run(pair, method, config, prompt))
    (out / "random.json").write_text(json.dumps(traces))
    print(f"{len(traces)} random-pair traces -> {out / 'random.json'}")
    if embedded:
        from via_sd import DecodeConfig

        torch.set_num_threads(2)
        pair = load_pair("embedded")
        fix_costs(pair)
        traces = []
        for method, kw in (("ar", {}), ("sd", {}), ("via", {}), ("via", {"drafter": "hybrid"}),
                           ("sd", {"drafter": "early-exit", "gamma": 3}), ("via", {"temperature": 0.7, "seed": 2})):
            traces.append(run(pair, method, DecodeConfig(max_new_tokens=24, **kw),
                              "Write a Python function that reverses a string, and explain it."))
        (out / "embedded.json").write_text(json.dumps(traces))
        print(f"{len(traces)} embedded-pair traces -> {out / 'embedded.json'}")


def diff(a, b, path="", out=None):
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k in TIMING:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k in b else 'before'}")
            else:
                diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {a!r} != {b!r}")
    return out


def compare(before: Path, after: Path) -> int:
    bad = 0
    for name in ("random.json", "embedded.json"):
        if not (before / name).exists() or not (after / name).exists():
            continue
        a, b = json.loads((before / name).read_text()), json.loads((after / name).read_text())
        found = diff(a, b, name)
        print(f"{name}: {len(a)} traces, {len(found)} differences")
        for line in found[:30]:
            print("  " + line)
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dir", type=Path)
    r.add_argument("--embedded", action="store_true")
    r.add_argument("--limit", type=int, default=0, help="the first N cases only")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.dir, args.embedded, args.limit)
    else:
        sys.exit(compare(args.before, args.after))
