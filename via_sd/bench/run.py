"""Timed runs: one method on one prompt, and the interleaved benchmark of several methods over prompts."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import replace

import torch

from ..core.decoding import Clock, DecodeConfig, generate
from ..weights.machine import cpu_name
from .fidelity import score_output
from .calls import trace_record
from .drafter_methods import DRAFTER_METHODS, run_drafter_method
from .hf import generate_hf
from .inputs import as_prompts
from .llama_peer import LLAMA_METHODS, peer_missing, run_llama
from .methods import BENCH_METHODS, OUR_METHODS, SCHEMA  # noqa: F401 (re-exported)
from .metrics import run_key, summarize_bench



def machine_info(pair) -> dict:
    import transformers

    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "device": str(pair.slim.device), "dtype": str(pair.dtype).replace("torch.", ""),
            "load_average_at_start": list(os.getloadavg())}
    if pair.slim.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(pair.slim.device)
    return info


def _reset_peak_memory(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device) -> tuple[float, str]:
    """(MiB, what was measured): CUDA allocator peak of this run, or the process's RSS peak so far."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda max_memory_allocated (per run)"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS (ru_maxrss, since start)"


def run_once(pair, prompt: str, method: str, config: DecodeConfig) -> tuple[dict, object]:
    """One timed run: (record, trace or None for `hf`). One clock, CUDA-synchronized, for all."""
    device = pair.slim.device
    _reset_peak_memory(device)
    clock = Clock(device)
    start = clock.ms()
    if method == "hf":
        token_ids, calls = generate_hf(pair, prompt, config)
        wall_ms = clock.ms() - start
        n = len(token_ids)
        record = {"tokens_per_s": 1000.0 * n / wall_ms if wall_ms > 0 else 0.0, "wall_ms": wall_ms,
                  "new_tokens": n, "prompt_tokens": len(pair.encode(prompt, chat=config.chat)),
                  "token_ids": token_ids, "drafter_calls": calls["drafter"], "full_calls": calls["full"]}
        trace = None
    elif method in ("ar", "sd", "via"):
        trace = generate(pair, prompt, method, config)
        wall_ms = clock.ms() - start
        record = trace_record(trace, wall_ms)
    elif method in DRAFTER_METHODS:
        record, trace = run_drafter_method(pair, prompt, method, config)
    elif method in LLAMA_METHODS:
        record, trace = run_llama(pair, prompt, method, config), None
    else:
        raise ValueError(f"unknown method {method!r}: use {', '.join(BENCH_METHODS)}")
    record["peak_memory_mb"], record["peak_memory_kind"] = peak_memory(device)
    record["load_1min"] = os.getloadavg()[0]  # other processes on the machine: read noisy runs with it
    return {"method": method, **record}, trace


def score_runs(pair, runs: list[dict], prompts: list[dict], config: DecodeConfig, progress=None,
               label: str = "method", reference: str | None = "ar") -> None:
    """Adds full-verifier fidelity to every run, and identity / log-prob difference against the
    `reference` run of the same prompt and repeat. One forward per distinct output (greedy repeats agree)."""
    prompt_ids = [pair.encode(p["prompt"], chat=config.chat) for p in prompts]
    distinct = distinct_outputs(runs)
    scores = {}
    for n, key in enumerate(distinct):
        if progress:
            progress(f"fidelity {n + 1}/{len(distinct)}", n / len(distinct))
        scores[key] = score_output(pair, prompt_ids[key[0]], list(key[1]))
    apply_scores(runs, scores, label, reference)


def distinct_outputs(runs: list[dict]) -> list[tuple]:
    """(prompt index, token ids) of every distinct output among `runs`, shortest first per prompt."""
    return sorted({(r["prompt_index"], tuple(r["token_ids"])) for r in runs}, key=lambda k: (k[0], len(k[1])))


def apply_scores(runs: list[dict], scores: dict, label: str = "method", reference: str | None = "ar") -> None:
    """Writes each run's fidelity (`scores`: {(prompt index, token ids): score_output's dict}) and its identity /
    log-prob difference against the `reference` run of the same prompt and repeat."""
    for r in runs:
        f = scores[(r["prompt_index"], tuple(r["token_ids"]))]
        r.update({"agreement": f["agreement"], "agreeing": f["agreeing"], "scored_tokens": f["tokens"],
                  "mean_logprob": f["mean_logprob"], "first_disagreement": f["first_disagreement"]})
    refs = {run_key(r): r for r in runs if reference and r[label] == reference}
    for r in runs:
        ref = refs.get(run_key(r))
        if ref is not None:
            r[f"identical_to_{reference}"] = r["token_ids"] == ref["token_ids"]
            r[f"logprob_delta_vs_{reference}"] = (r["mean_logprob"] - ref["mean_logprob"]
                                                  if None not in (r["mean_logprob"], ref["mean_logprob"]) else None)


def rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def without_missing_peers(pair, methods: list[str]) -> tuple[list[str], dict]:
    """(methods that can run, {skipped method: why}): the llama.cpp peer's methods are dropped, with one plain
    line on stderr, where llama-cpp-python is not installed (or the pair has no GGUF files for it)."""
    wanted = [m for m in methods if m in LLAMA_METHODS]
    why = peer_missing(pair) if wanted else None
    if not why:
        return methods, {}
    print(f"{why} (skipping {', '.join(wanted)})", file=sys.stderr, flush=True)
    return [m for m in methods if m not in LLAMA_METHODS], dict.fromkeys(wanted, why)


def run_bench(pair, prompts, methods=OUR_METHODS, config: DecodeConfig | None = None, repeats: int = 3,
              warmup: int = 1, fidelity: bool = True, progress=None) -> dict:
    """Benchmarks `methods` on `prompts` (dicts {task, prompt} or strings); returns the result dict.

    `progress(message, fraction)` is called after every run.
    """
    config = config or DecodeConfig()
    prompts = as_prompts(prompts)
    methods = list(dict.fromkeys(methods))
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown methods {unknown}: use some of {', '.join(BENCH_METHODS)}")
    methods, skipped = without_missing_peers(pair, methods)
    if not methods:
        raise ValueError(f"nothing left to run: {'; '.join(sorted(set(skipped.values())))}")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    report = progress or (lambda message, fraction: None)
    machine = machine_info(pair)
    for w in range(warmup):  # first calls pay for allocation and lazy initialisation
        warm_up(pair, prompts[0]["prompt"], methods, config)
        report(f"warm-up {w + 1}/{warmup} done", 0.0)
    runs, total, order = [], repeats * len(prompts) * len(methods), 0
    for rep in range(repeats):
        for i, p in enumerate(prompts):
            # rotate the order so no method always runs first (or right after the same neighbour)
            for method in rotated(methods, rep * len(prompts) + i):
                record, _ = run_once(pair, p["prompt"], method, config)
                record.update(prompt_index=i, task=p["task"], repeat=rep, order=order)
                runs.append(record)
                order += 1
                report(f"repeat {rep + 1}/{repeats}, prompt {i + 1}/{len(prompts)} ({p['task']}), {method}: "
                       f"{record['tokens_per_s']:.2f} tokens/s", order / total)
    if fidelity:
        score_runs(pair, runs, prompts, config, progress=report, reference="ar" if "ar" in methods else None)
    return bench_result(machine, pair.describe(), config, methods, skipped, repeats, warmup, prompts, runs)


def warm_up(pair, prompt: str, methods: list[str], config: DecodeConfig) -> None:
    """One short run of every method: first calls pay for allocation and lazy initialisation."""
    warm_cfg = replace(config, max_new_tokens=min(config.max_new_tokens, 16))
    for method in methods:
        run_once(pair, prompt, method, warm_cfg)


def bench_result(machine: dict, models: dict, config: DecodeConfig, methods: list[str], skipped: dict, repeats: int,
                 warmup: int, prompts: list[dict], runs: list[dict]) -> dict:
    """The bench's result dict from its measured (and scored) runs, summarized."""
    result = {
        "schema": SCHEMA, "kind": "bench", "machine": {**machine, "load_average_at_end": list(os.getloadavg())},
        "models": models,
        "config": config.to_dict(), "methods": methods, "skipped_methods": skipped, "repeats": repeats,
        "warmup": warmup,
        "tokens_per_s_counts": "new tokens / wall time of the whole call (encoding and prefill included)",
        "prompts": [{"index": i, "task": p["task"], "prompt": p["prompt"]} for i, p in enumerate(prompts)],
        "runs": runs,
    }
    summarize_bench(result)
    return result
