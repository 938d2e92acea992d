"""The threshold sweep: VIA-SD over a grid of thresholds, signals and routes, against plain SD run alongside."""

from __future__ import annotations

import os
from dataclasses import replace

from ..core.decoding import DecodeConfig
from ..core.plan import Thresholds
from .inputs import as_prompts
from .metrics import FIDELITY_TARGET, metrics
from .run import SCHEMA, machine_info, rotated, run_once, score_runs


def pareto(points: list[dict], x: str = "fidelity", y: str = "speedup") -> list[dict]:
    """Points no other point beats on both `x` and `y` (ties kept), sorted by `x`."""
    valid = [p for p in points if p.get(x) is not None and p.get(y) is not None]
    front = [p for p in valid if not any(q[x] >= p[x] and q[y] >= p[y] and (q[x] > p[x] or q[y] > p[y])
                                         for q in valid)]
    return sorted(front, key=lambda p: (p[x], -p[y]))


def _route_label(route) -> str:
    return route.name if route.name != "custom" else ",".join(route.skip) or "none"


def _settings(routes, signals, accept, escalate) -> list[tuple]:
    """(route, signal, accept, escalate) of every grid point whose escalate is not above its accept."""
    route_list = list(routes) if routes else [None]
    settings = [(route, signal, a, e) for route in route_list for signal in signals
                for a in accept for e in escalate if e <= a + 1e-9]
    if not settings:
        raise ValueError("the sweep grid is empty: every escalate value is above every accept value")
    return settings


def _via_config(config: DecodeConfig, setting: tuple) -> DecodeConfig:
    """The run's config with the grid point's thresholds."""
    _, signal, a, e = setting
    return replace(config, thresholds=Thresholds(accept=a, escalate=min(e, a), signal=signal))


def _use_route(pair, original, route) -> None:
    """The pair's slim verifier for `route` (None: the one it came with)."""
    pair.slim = original
    if route is not None:
        pair.set_route(route)


def _point_meta(pair, original, settings: list[tuple]) -> list[dict]:
    """Each grid point's route (as the pair resolves it) and thresholds."""
    meta = []
    for route, signal, a, e in settings:
        _use_route(pair, original, route)
        meta.append({"route": _route_label(pair.route), "skipped": list(pair.route.skip),
                     "skip_fraction": pair.route.skip_fraction, "signal": signal, "accept": a, "escalate": e})
    return meta


def warm_up_sweep(pair, original, prompt: str, config: DecodeConfig, settings: list[tuple]) -> None:
    """One short plain-SD run and one of the first grid point."""
    run_once(pair, prompt, "sd", replace(config, max_new_tokens=min(config.max_new_tokens, 16)))
    _use_route(pair, original, settings[0][0])
    run_once(pair, prompt, "via", replace(_via_config(config, settings[0]), max_new_tokens=16))


def sweep_labels(settings: list[tuple]) -> list[str]:
    """What a sweep measures on every prompt and repeat: plain SD, then each grid point."""
    return ["sd"] + [f"point{k}" for k in range(len(settings))]


def run_label(pair, original, prompt: str, label: str, config: DecodeConfig, settings: list[tuple]) -> dict:
    """One timed run of a sweep: plain SD ("sd") or grid point k ("point<k>") on its route."""
    if label == "sd":
        return run_once(pair, prompt, "sd", config)[0]
    setting = settings[int(label[5:])]
    _use_route(pair, original, setting[0])
    return run_once(pair, prompt, "via", _via_config(config, setting))[0]


def _measure(pair, original, prompts: list[dict], config: DecodeConfig, settings: list[tuple], repeats: int,
             warmup: int, report, stop) -> tuple[list[dict], bool]:
    """Plain SD and every grid point on every prompt, interleaved (rotated per prompt and repeat): (runs, stopped)."""
    for _ in range(warmup):
        warm_up_sweep(pair, original, prompts[0]["prompt"], config, settings)
    labels = sweep_labels(settings)
    total, runs = repeats * len(prompts) * len(labels), []
    for rep, i, label in ((rep, i, label) for rep in range(repeats) for i in range(len(prompts))
                          for label in rotated(labels, rep * len(prompts) + i)):
        if stop is not None and stop.is_set():
            break
        p = prompts[i]
        record = run_label(pair, original, p["prompt"], label, config, settings)
        record.update(label=label, prompt_index=i, task=p["task"], repeat=rep, order=len(runs))
        runs.append(record)
        report(f"sweep {len(runs)}/{total}: {label} on prompt {i + 1}: {record['tokens_per_s']:.2f} tokens/s",
               len(runs) / total)
    return runs, len(runs) < total


def _points(runs: list[dict], points_meta: list[dict]) -> list[dict]:
    """Every measured grid point: speed-up against plain SD, fidelity and the tier statistics."""
    measured = {r["label"] for r in runs}
    points = []
    for k, meta in enumerate(points_meta):
        if f"point{k}" not in measured:
            continue
        m = metrics([r for r in runs if r["label"] == f"point{k}"], runs, label="label", ar=None, sd="sd",
                    reference="sd")
        points.append({**meta, "speedup": m["speedup_vs_sd"], "fidelity": m["agreement"],
                       "tokens_per_s": m["tokens_per_s"], "mean_logprob": m["mean_logprob"],
                       "logprob_delta_vs_sd": m["logprob_delta_vs_sd"], "identical_to_sd": m["identical_to_sd"],
                       "rejection_rate": m["rejection_rate"], "verified_rejection_rate": m["verified_rejection_rate"],
                       "unverified_share": m["unverified_share"], "mean_accepted_length": m["mean_accepted_length"],
                       "full_calls_per_token": m["full_calls_per_token"],
                       "slim_calls_per_token": m["slim_calls_per_token"], "tier_shares": m["tier_shares"]})
    return points


def run_sweep(pair, prompts, config: DecodeConfig | None = None, accept=(0.5, 0.7, 0.9), escalate=(0.0, 0.2, 0.4),
              signals=("slim", "draft"), routes=None, repeats: int = 1, warmup: int = 1, progress=None,
              stop=None) -> dict:
    """VIA-SD over a threshold grid (escalate <= accept) per signal and route, against plain SD
    measured in the same interleaved run. Returns points (speed-up vs SD, fidelity), the frontier
    and the fastest point with agreement >= 0.95.

    `routes`: list of anything `pair.set_route` takes; None keeps the pair's route. Under greedy
    decoding a point's output is deterministic, so fidelity needs one forward per distinct output.
    `stop`: anything with `is_set()`, checked between measured runs; once set, the sweep ends there and
    reports what it measured (points without a run are left out; "stopped" is True).
    """
    config = config or DecodeConfig()
    prompts = as_prompts(prompts)
    report = progress or (lambda message, fraction: None)
    machine = machine_info(pair)
    original = pair.slim
    settings = _settings(routes, signals, accept, escalate)
    try:
        points_meta = _point_meta(pair, original, settings)
        runs, stopped = _measure(pair, original, prompts, config, settings, repeats, warmup, report, stop)
    finally:
        pair.slim = original
    if "sd" not in {r["label"] for r in runs}:  # stopped before the baseline ran: nothing to compare with
        return {"schema": SCHEMA, "kind": "sweep", "stopped": True, "sd": None, "points": [], "frontier": [],
                "best": None, "runs": runs}
    # SD's greedy output is the full model's own, so it is the fidelity reference
    score_runs(pair, runs, prompts, config, progress=report, label="label", reference="sd")
    return sweep_result(machine, pair.describe(), config, prompts, points_meta, runs, repeats, warmup, stopped)


def sweep_result(machine: dict, models: dict, config: DecodeConfig, prompts: list[dict], points_meta: list[dict],
                 runs: list[dict], repeats: int, warmup: int, stopped: bool) -> dict:
    """The sweep's result dict from its measured and scored runs: points, frontier and the best point."""
    sd = metrics([r for r in runs if r["label"] == "sd"], runs, label="label", ar=None, sd="sd", reference="sd")
    points = _points(runs, points_meta)
    front = pareto(points)
    for p in points:
        p["pareto"] = p in front
    good = [p for p in points if p["fidelity"] is not None and p["fidelity"] >= FIDELITY_TARGET
            and p["speedup"] is not None]
    best = max(good, key=lambda p: p["speedup"]) if good else None
    return {
        "schema": SCHEMA, "kind": "sweep", "machine": {**machine, "load_average_at_end": list(os.getloadavg())},
        "models": models,
        "config": config.to_dict(), "repeats": repeats, "warmup": warmup, "baseline": "sd",
        "speedup_is": "median paired tokens/s ratio VIA-SD / plain SD (same prompt, same repeat)",
        "fidelity_is": "full-model top-1 agreement on the emitted tokens (teacher-forced)",
        "prompts": [{"index": i, "task": p["task"], "prompt": p["prompt"]} for i, p in enumerate(prompts)],
        "sd": {"method": "sd", "speedup": 1.0, "fidelity": sd["agreement"], "tokens_per_s": sd["tokens_per_s"],
               "rejection_rate": sd["rejection_rate"], "verified_rejection_rate": sd["verified_rejection_rate"],
               "mean_accepted_length": sd["mean_accepted_length"]},
        "points": points, "frontier": front, "best": best, "runs": runs, "stopped": stopped,
    }
