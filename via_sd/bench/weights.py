"""Weights settings side by side: the same methods and prompts on pairs loaded as fp32, int4, ...

    python -m via_sd bench --weights fp32,int4 --methods ar,sd,via --limit 4 --max-new-tokens 64

Every pair stays loaded; per repeat and prompt, every (weights, method) runs once, the order
rotating, so a noisy machine slows every setting alike. Speed-ups are medians of paired ratios
(same prompt, same repeat): each method against its own fp32 self, and SD / VIA-SD against AR
of the same weights.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import replace

from ..core.decoding import DecodeConfig
from .inputs import as_prompts
from .run import machine_info, rotated, run_once

SCHEMA = "via-sd-bench-weights/1"


def run_weights_bench(pairs: dict, prompts, methods=("ar", "sd", "via"), config: DecodeConfig | None = None,
                      repeats: int = 2, warmup: int = 1, progress=None) -> dict:
    """`pairs`: {weights setting: ModelPair}. Returns runs and a summary per setting and method."""
    config = config or DecodeConfig()
    prompts = as_prompts(prompts)
    report = progress or (lambda message, fraction: None)
    cells = [(w, m) for w in pairs for m in methods]
    warm = replace(config, max_new_tokens=min(config.max_new_tokens, 16))
    for _ in range(warmup):
        for w, m in cells:
            run_once(pairs[w], prompts[0]["prompt"], m, warm)
    runs, total = [], repeats * len(prompts) * len(cells)
    for rep in range(repeats):
        for i, p in enumerate(prompts):
            for w, m in rotated(cells, rep * len(prompts) + i):
                record, _ = run_once(pairs[w], p["prompt"], m, config)
                record.update(weights=w, prompt_index=i, task=p["task"], repeat=rep)
                runs.append(record)
                report(f"repeat {rep + 1}/{repeats}, prompt {i + 1}/{len(prompts)}, {w} {m}: "
                       f"{record['tokens_per_s']:.2f} tokens/s", len(runs) / total)
    first = next(iter(pairs.values()))
    return {"schema": SCHEMA, "kind": "bench-weights", "machine": {**machine_info(first),
                                                                 "load_average_at_end": list(os.getloadavg())},
            "models": {w: pair.describe() for w, pair in pairs.items()}, "config": config.to_dict(),
            "methods": list(methods), "weights": list(pairs), "repeats": repeats, "prompts": prompts,
            "runs": runs, "summary": summarize_weights(runs, list(pairs), list(methods))}


def _paired(runs, a: tuple, b: tuple) -> float | None:
    """Median over (prompt, repeat) of tokens/s of cell a over cell b."""
    by = {(r["weights"], r["method"], r["prompt_index"], r["repeat"]): r["tokens_per_s"] for r in runs}
    ratios = [by[(*a, i, rep)] / by[(*b, i, rep)] for (w, m, i, rep) in by
              if (w, m) == a and (*b, i, rep) in by and by[(*b, i, rep)] > 0]
    return statistics.median(ratios) if ratios else None


def summarize_weights(runs: list[dict], weights: list[str], methods: list[str]) -> dict:
    base = "fp32" if "fp32" in weights else weights[0]
    summary = {}
    for w in weights:
        for m in methods:
            mine = [r for r in runs if r["weights"] == w and r["method"] == m]
            ref = {(r["prompt_index"], r["repeat"]): r["token_ids"] for r in runs
                   if r["weights"] == base and r["method"] == m}
            same = [r["token_ids"] == ref[(r["prompt_index"], r["repeat"])] for r in mine
                    if (r["prompt_index"], r["repeat"]) in ref]
            summary.setdefault(w, {})[m] = {
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
                f"speedup_vs_{base}": _paired(runs, (w, m), (base, m)),
                "speedup_vs_ar": _paired(runs, (w, m), (w, "ar")) if "ar" in methods else None,
                f"same_tokens_as_{base}": sum(same) / len(same) if same else None,
                "peak_memory_mb": max(r["peak_memory_mb"] for r in mine)}
    return summary


def markdown_weights(result: dict) -> str:
    s, methods, base = result["summary"], result["methods"], result["weights"][0]
    base = "fp32" if "fp32" in result["weights"] else base
    names = {"ar": "AR", "sd": "SD", "via": "VIA-SD", "hf": "HF assisted"}
    lines = [f"| weights | method | tokens/s | × {base} (same method) | × AR (same weights) | "
             f"same tokens as {base} |", "|---|---|---|---|---|---|"]

    def f(v, fmt="{:.2f}"):
        return "–" if v is None else fmt.format(v)
    for w in result["weights"]:
        for m in methods:
            c = s[w][m]
            lines.append(f"| {w} | {names.get(m, m)} | {f(c['tokens_per_s'])} | {f(c[f'speedup_vs_{base}'], '{:.2f}×')} | "
                         f"{f(c['speedup_vs_ar'], '{:.2f}×')} | {f(c[f'same_tokens_as_{base}'], '{:.2f}')} |")
    cfg = result["config"]
    lines += ["", f"{len(result['prompts'])} prompts × {result['repeats']} repeats, gamma {cfg['gamma']}, "
              f"{cfg['max_new_tokens']} new tokens; ratios are medians of paired runs (same prompt, same repeat)."]
    return "\n".join(lines)
