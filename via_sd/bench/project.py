"""A projected speed-up: each run's recorded forward calls priced with costs measured elsewhere (e.g. a GPU)."""

from __future__ import annotations

from ..cost.model import interpolate
from .calls import MODELS
from .metrics import median, median_ratio


def project(result: dict, costs: dict) -> dict:
    """Projected tokens/s and speed-ups: each run's forward calls (drafter, slim, full, with the
    tokens each fed, rebuilt from its trace) priced with `costs` (scripts/gpu_check.py's file).

    Counts only forward passes (no loop overhead), so it is an upper bound on the speed-up.
    """
    lengths = costs["lengths"]
    slim_by_skip = {tuple(sorted(skip)): label for label, skip in costs.get("routes", {}).items()}
    per_run, notes = [], []
    for r in result["runs"]:
        if "call_lengths" not in r:
            continue
        table = {"drafter": costs["ms"]["drafter"], "full": costs["ms"]["full"]}
        if r["call_lengths"]["slim"]:
            label = slim_by_skip.get(tuple(sorted(r.get("skipped") or [])))
            if label is None:
                notes.append(f"no measured slim cost for route {r.get('route')!r}: runs using it are not projected")
                continue
            table["slim"] = costs["ms"]["slim"][label]
        ms = sum(interpolate(dict(zip(lengths, table[m])), n, through_origin=False) for m in MODELS for n in r["call_lengths"][m])
        per_run.append({k: r[k] for k in ("method", "prompt_index", "repeat", "task")} | {
            "tokens_per_s": 1000.0 * r["new_tokens"] / ms if ms else 0.0, "ms": ms})
    methods = list(dict.fromkeys(p["method"] for p in per_run))
    summary = {m: {"tokens_per_s": median([p["tokens_per_s"] for p in per_run if p["method"] == m]),
                   "speedup_vs_ar": median_ratio(per_run, m, "ar") if "ar" in methods else None,
                   "speedup_vs_sd": median_ratio(per_run, m, "sd") if "sd" in methods else None} for m in methods}
    return {"label": f"projected: acceptance and tiers measured on {result['models'].get('verifier')} "
                     f"({result['machine'].get('device')}), forward costs measured on {costs.get('device_name')} "
                     f"for the {costs.get('pair')} pair configs ({costs.get('dtype')}); forward passes only",
            "costs_source": {k: costs.get(k) for k in ("pair", "device", "device_name", "dtype", "context")},
            "summary": summary, "runs": per_run, "notes": sorted(set(notes))}
