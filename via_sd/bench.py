"""Side-by-side benchmark: AR, plain SD, VIA-SD and transformers' assisted generation on one pair.

    python -m via_sd bench --preset embedded --prompts assets/prompts/mixed.jsonl \
        --methods ar,sd,via,hf --max-new-tokens 128 --repeats 3 --json out.json
    python -m via_sd bench ... --sweep accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1 --signals slim,draft

Runs are interleaved (per repeat, per prompt, one run of each method in turn, the order rotating)
after a warm-up, so a noisy machine slows every method alike. Speed-ups are medians of paired
ratios: method vs baseline on the same prompt in the same repeat. `tokens_per_s` counts the whole
call (prompt encoding and prefill included) with one clock for every method, since transformers'
`generate` cannot be split into prefill and decode; the engine's decode-only rate is kept as
`decode_tokens_per_s`. Acceptance statistics are pooled over runs (vLLM's way: accepted length =
emitted tokens / verification rounds, bonus included). `hf` is
`verifier.generate(assistant_model=drafter)` with the same draft length and the same early stop
(`draft_stop`, transformers' `assistant_confidence_threshold`; off by default).

Python API (the app uses it for small sweeps):
    result = run_bench(pair, prompts, methods=("ar", "sd", "via"), config=DecodeConfig(...), repeats=3)
    sweep = run_sweep(pair, prompts, config, accept=[0.5, 0.7], escalate=[0.0, 0.2], signals=["slim"])
    print(markdown(result)); print(markdown_sweep(sweep))
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from .decoding import Clock, DecodeConfig, generate
from .fidelity import score_output
from .tiers import Thresholds
from .trace import KEPT_DECISIONS

SCHEMA = "via-sd-bench/1"
BENCH_METHODS = ("ar", "sd", "via", "hf")
PHASES = ("prefill", "draft", "slim", "full", "other")
MODELS = ("drafter", "slim", "full")
FIDELITY_TARGET = 0.95
DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "mixed.jsonl"


# ---- inputs --------------------------------------------------------------------------------------

def load_prompts(path, tasks=None, limit: int | None = None) -> list[dict]:
    """JSON lines {"task": ..., "prompt": ...}; a bad line is a ValueError naming its number."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {n}: not valid JSON ({err.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f'{path}, line {n}: expected an object {{"task": "...", "prompt": "..."}}')
        for key in ("task", "prompt"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ValueError(f'{path}, line {n}: "{key}" must be a non-empty string')
        prompts.append({"task": item["task"], "prompt": item["prompt"], "line": n})
    if tasks:
        prompts = [p for p in prompts if p["task"] in set(tasks)]
    if limit:
        prompts = prompts[:limit]
    if not prompts:
        raise ValueError(f"{path} holds no prompts" + (f" for tasks {', '.join(tasks)}" if tasks else ""))
    return prompts


def _as_prompts(prompts) -> list[dict]:
    out = [{"task": "default", "prompt": p} if isinstance(p, str) else dict(p) for p in prompts]
    if not out:
        raise ValueError("no prompts to benchmark")
    return out


def parse_values(text: str) -> list[float]:
    """"0.3:0.9:0.1" (inclusive range), "0.5" or "0.2|0.5|0.8" -> a list of floats."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"range {text!r}: write start:stop:step, e.g. 0.3:0.9:0.1")
        start, stop, step = map(float, parts)
        if step <= 0 or stop < start:
            raise ValueError(f"range {text!r}: need start <= stop and a positive step")
        return [round(start + k * step, 6) for k in range(int(math.floor((stop - start) / step + 1e-9)) + 1)]
    return [float(v) for v in text.split("|")]


def parse_grid(spec: str) -> dict[str, list[float]]:
    """"accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1" -> {"accept": [...], "escalate": [...]}."""
    grid = {}
    for part in spec.split(","):
        name, sep, values = part.partition("=")
        if not sep or name.strip() not in ("accept", "escalate"):
            raise ValueError(f"sweep part {part!r}: write accept=START:STOP:STEP or escalate=...")
        grid[name.strip()] = parse_values(values.strip())
    for name, values in grid.items():
        if any(not 0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"sweep {name} values must lie in [0, 1], got {values}")
    return grid


# ---- one run -------------------------------------------------------------------------------------

def machine_info(pair) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    info = {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
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


def prefilled_models(trace) -> set[str]:
    """Models that read the prompt in a separate prefill pass before round 0.

    Today's engine has none (prefill_ms is 0: each model reads the prompt with its first call);
    traces from earlier engines prefilled the models each method needs with all but the last
    prompt token.
    """
    if trace.summary["prompt_tokens"] <= 1 or not trace.summary.get("prefill_ms"):
        return set()
    signal = (trace.config.get("thresholds") or {}).get("signal", "slim")
    return {"ar": {"full"}, "sd": {"drafter", "full"},
            "via": {"drafter", "slim"} if signal == "slim" else {"drafter"}}[trace.method]


def forward_calls(trace) -> list[tuple[str, int, int]]:
    """Every forward call as (model, round, tokens fed); round -1 is a separate prefill.

    Rebuilt from the trace by replaying the engine's cache rule: each model feeds what it has not
    seen, and after a round every cache is cut back to the tokens that were kept.
    """
    prompt_len = trace.summary["prompt_tokens"]
    calls, seen = [], {m: 0 for m in MODELS}
    for m in sorted(prefilled_models(trace)):
        calls.append((m, -1, prompt_len - 1))
        seen[m] = prompt_len - 1
    emitted = Counter(t["round"] for t in trace.tokens)
    length = prompt_len
    for r in trace.rounds:
        k, n_drafts = r["round"], len(r["candidates"])
        if n_drafts:  # one forward per draft; the last draft is not fed until the next round
            calls += [("drafter", k, length - seen["drafter"])] + [("drafter", k, 1)] * (n_drafts - 1)
            seen["drafter"] = length + n_drafts - 1
        for m in ("slim", "full"):
            if r[f"{m}_called"]:
                calls.append((m, k, length + n_drafts - seen[m]))
                seen[m] = length + n_drafts
        kept = sum(c["decision"] in KEPT_DECISIONS for c in r["candidates"])
        valid = length + min(kept, emitted[k])
        seen = {m: min(n, valid) for m, n in seen.items()}
        length += emitted[k]
    return calls


def call_lengths(trace) -> dict[str, list[int]]:
    """Tokens fed to the drafter, slim and full verifier in each of their forward calls, in order."""
    out = {m: [] for m in MODELS}
    for model, _, n in forward_calls(trace):
        out[model].append(n)
    return out


def _trace_record(trace, wall_ms: float) -> dict:
    s, gamma = trace.summary, trace.config["gamma"]
    drafted, kept = [0] * gamma, [0] * gamma
    for r in trace.rounds:
        for c in r["candidates"]:
            drafted[c["pos"]] += 1
            kept[c["pos"]] += c["decision"] in KEPT_DECISIONS
    phase = {"prefill": s["prefill_ms"]}
    phase.update({p: sum(r[f"{p}_ms"] for r in trace.rounds) for p in ("draft", "slim", "full")})
    phase["other"] = max(wall_ms - sum(phase.values()), 0.0)  # loop overhead, prompt encoding, text
    calls = forward_calls(trace)
    # per-call costs leave out prefill and round 0, whose first calls also read the prompt
    later = [r for r in trace.rounds if r["round"] > 0]
    n = s["new_tokens"]
    return {
        "tokens_per_s": 1000.0 * n / wall_ms if wall_ms > 0 else 0.0,
        "decode_tokens_per_s": s["tokens_per_s"], "wall_ms": wall_ms, "new_tokens": n,
        "prompt_tokens": s["prompt_tokens"], "token_ids": list(trace.token_ids), "rounds": len(trace.rounds),
        "drafted": sum(drafted), "kept": sum(kept), "drafted_by_position": drafted, "kept_by_position": kept,
        "tier_counts": dict(s["tier_counts"]), "drafter_calls": sum(drafted), "slim_calls": s.get("slim_calls", 0),
        "full_calls": s["full_calls"], "phase_ms": phase,
        "call_lengths": {m: [c for model, _, c in calls if model == m] for m in MODELS},
        "steady": {"ms": {m: sum(r[f"{p}_ms"] for r in later) for m, p in zip(MODELS, ("draft", "slim", "full"))},
                   "calls": {m: sum(1 for model, k, _ in calls if model == m and k > 0) for m in MODELS},
                   "fed": {m: sum(c for model, k, c in calls if model == m and k > 0) for m in MODELS}},
        "route": trace.models.get("route"), "skipped": list(trace.models.get("skipped") or []),
        "thresholds": trace.config["thresholds"] if trace.method == "via" else None,
    }


@torch.inference_mode()
def generate_hf(pair, prompt: str, config: DecodeConfig) -> tuple[list[int], dict]:
    """transformers' assisted generation on the same pair: gamma drafts per round, fixed.

    Returns (new token ids, forward calls per model). The drafter's generation config is restored.
    """
    gen_cfg = pair.drafter.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {k: getattr(gen_cfg, k, None) for k in keys}
    # transformers reads the draft length from the assistant's config; its confidence threshold
    # ends drafting early as the engine's draft_stop does (0 = off)
    gen_cfg.num_assistant_tokens, gen_cfg.num_assistant_tokens_schedule = config.gamma, "constant"
    gen_cfg.assistant_confidence_threshold = float(getattr(config, "draft_stop", 0.0))
    calls = {"drafter": 0, "full": 0}

    def counter(name):
        def hook(*_):
            calls[name] += 1
        return hook

    hooks = [pair.drafter.register_forward_pre_hook(counter("drafter")),
             pair.verifier.register_forward_pre_hook(counter("full"))]
    try:
        ids = torch.tensor([pair.encode(prompt, chat=config.chat)], device=pair.slim.device)
        eos = sorted(pair.eos_ids)
        pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos or [0])[0]
        sampling = {} if config.greedy else {"temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
        if not config.greedy:
            torch.manual_seed(config.seed)
        out = pair.verifier.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=pair.drafter,
                                     do_sample=not config.greedy, max_new_tokens=config.max_new_tokens,
                                     eos_token_id=eos or None, pad_token_id=pad, repetition_penalty=1.0,
                                     **sampling)
        new = out[0, ids.shape[1]:].tolist()
        pair.tokenizer.decode(new, skip_special_tokens=True)  # as the engine does, so both pay for the text
    finally:
        for h in hooks:
            h.remove()
        for k, v in saved.items():
            setattr(gen_cfg, k, v)
    return new, calls


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
        record = _trace_record(trace, wall_ms)
    else:
        raise ValueError(f"unknown method {method!r}: use {', '.join(BENCH_METHODS)}")
    record["peak_memory_mb"], record["peak_memory_kind"] = peak_memory(device)
    record["load_1min"] = os.getloadavg()[0]  # other processes on the machine: read noisy runs with it
    return {"method": method, **record}, trace


# ---- aggregation ---------------------------------------------------------------------------------

def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _key(run) -> tuple:
    return run["prompt_index"], run["repeat"]


def paired_ratios(runs: list[dict], method: str, baseline: str, label: str = "method") -> list[dict]:
    """tokens/s of `method` over `baseline` for each (prompt, repeat) both ran."""
    base = {_key(r): r for r in runs if r[label] == baseline}
    out = []
    for r in runs:
        b = base.get(_key(r))
        if r[label] == method and b is not None and b["tokens_per_s"] > 0:
            out.append({"prompt_index": r["prompt_index"], "repeat": r["repeat"],
                        "ratio": r["tokens_per_s"] / b["tokens_per_s"]})
    return out


def _ratio(runs, method, baseline, label="method"):
    return _median([p["ratio"] for p in paired_ratios(runs, method, baseline, label)])


def _pooled(runs, num: str, den: str):
    d = sum(r.get(den) or 0 for r in runs)
    return sum(r.get(num) or 0 for r in runs) / d if d else None


def _share(runs, key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def metrics(group: list[dict], context: list[dict], label: str = "method", ar: str | None = "ar",
            sd: str | None = "sd", reference: str | None = "ar") -> dict:
    """Metrics of one method (or sweep point) over its runs `group`.

    Speed-ups pair each run with the `ar` / `sd` run of the same prompt and repeat in `context`;
    acceptance counts and fidelity are pooled over runs; `reference` names the fidelity baseline.
    """
    name = group[0][label]
    traced = [r for r in group if "rounds" in r]
    scored = [r for r in group if r.get("scored_tokens")]
    out = {
        "runs": len(group),
        "tokens_per_s": _median([r["tokens_per_s"] for r in group]),
        "tokens_per_s_runs": [r["tokens_per_s"] for r in group],
        "decode_tokens_per_s": _median([r.get("decode_tokens_per_s") for r in group]),
        "speedup_vs_ar": _ratio(context, name, ar, label) if ar else None,
        "speedup_vs_sd": _ratio(context, name, sd, label) if sd else None,
        "new_tokens": sum(r["new_tokens"] for r in group),
        "full_calls_per_token": _pooled(group, "full_calls", "new_tokens"),
        "drafter_calls_per_token": _pooled(group, "drafter_calls", "new_tokens"),
        "peak_memory_mb": max(r["peak_memory_mb"] for r in group),
        "peak_memory_kind": group[0]["peak_memory_kind"],
        "agreement": _pooled(group, "agreeing", "scored_tokens"),
        "mean_logprob": (sum(r["mean_logprob"] * r["scored_tokens"] for r in scored)
                         / sum(r["scored_tokens"] for r in scored) if scored else None),
    }
    if reference:
        out[f"logprob_delta_vs_{reference}"] = _median([r.get(f"logprob_delta_vs_{reference}") for r in group])
        out[f"identical_to_{reference}"] = _share(group, f"identical_to_{reference}")
    if not traced:  # hf: only speed, forward calls and output
        out.update({k: None for k in ("mean_accepted_length", "rejection_rate", "acceptance_by_position",
                                      "tier_shares", "slim_calls_per_token", "phase_shares", "ms_per_call",
                                      "tokens_per_call", "ms_per_token")})
        return out
    gamma = max(len(r["drafted_by_position"]) for r in traced)
    drafted = [sum(r["drafted_by_position"][k] for r in traced if k < len(r["drafted_by_position"]))
               for k in range(gamma)]
    kept = [sum(r["kept_by_position"][k] for r in traced if k < len(r["kept_by_position"])) for k in range(gamma)]
    wall = sum(r["wall_ms"] for r in traced)
    tokens = sum(r["new_tokens"] for r in traced)
    phase = {p: sum(r["phase_ms"][p] for r in traced) for p in PHASES}
    calls = {m: sum(r[f"{m}_calls"] for r in traced) for m in MODELS}
    steady = {key: {m: sum(_steady(r)[key][m] for r in traced) for m in MODELS} for key in ("ms", "calls", "fed")}
    tier_counts = {t: sum(r["tier_counts"][t] for r in traced) for t in ("draft", "slim", "full")}
    kept_share = _pooled(traced, "kept", "drafted")
    out.update({
        "mean_accepted_length": _pooled(traced, "new_tokens", "rounds"),
        "rejection_rate": None if kept_share is None else 1.0 - kept_share,
        "acceptance_by_position": [k / d if d else None for k, d in zip(kept, drafted)],
        "tier_shares": {t: c / tokens if tokens else 0.0 for t, c in tier_counts.items()},
        "slim_calls_per_token": calls["slim"] / tokens if tokens else None,
        "phase_shares": {p: v / wall if wall else None for p, v in phase.items()},
        "ms_per_token": {p: v / tokens if tokens else None for p, v in phase.items()},
        # rounds after the first only: round 0's first calls also read the prompt
        "ms_per_call": {m: steady["ms"][m] / c if c else None for m, c in steady["calls"].items()},
        "tokens_per_call": {m: steady["fed"][m] / c if c else None for m, c in steady["calls"].items()},
    })
    return out


def _steady(run: dict) -> dict:
    """A run's per-call cost inputs; results written before they were recorded use the whole run."""
    if "steady" in run:
        return run["steady"]
    fed = run.get("fed_tokens") or {m: 0 for m in MODELS}
    return {"ms": {m: run["phase_ms"][p] for m, p in zip(MODELS, ("draft", "slim", "full"))},
            "calls": {m: run[f"{m}_calls"] for m in MODELS}, "fed": fed}


def _score_runs(pair, runs: list[dict], prompts: list[dict], config: DecodeConfig, progress=None,
                label: str = "method", reference: str | None = "ar") -> None:
    """Adds full-verifier fidelity to every run, and identity / log-prob difference against the
    `reference` run of the same prompt and repeat. One forward per distinct output (greedy repeats agree)."""
    prompt_ids = [pair.encode(p["prompt"], chat=config.chat) for p in prompts]
    distinct = sorted({(r["prompt_index"], tuple(r["token_ids"])) for r in runs}, key=lambda k: (k[0], len(k[1])))
    scores = {}
    for n, key in enumerate(distinct):
        if progress:
            progress(f"fidelity {n + 1}/{len(distinct)}", n / len(distinct))
        scores[key] = score_output(pair, prompt_ids[key[0]], list(key[1]))
    for r in runs:
        f = scores[(r["prompt_index"], tuple(r["token_ids"]))]
        r.update({"agreement": f["agreement"], "agreeing": f["agreeing"], "scored_tokens": f["tokens"],
                  "mean_logprob": f["mean_logprob"], "first_disagreement": f["first_disagreement"]})
    refs = {_key(r): r for r in runs if reference and r[label] == reference}
    for r in runs:
        ref = refs.get(_key(r))
        if ref is not None:
            r[f"identical_to_{reference}"] = r["token_ids"] == ref["token_ids"]
            r[f"logprob_delta_vs_{reference}"] = (r["mean_logprob"] - ref["mean_logprob"]
                                                  if None not in (r["mean_logprob"], ref["mean_logprob"]) else None)


def _rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def run_bench(pair, prompts, methods=BENCH_METHODS, config: DecodeConfig | None = None, repeats: int = 3,
              warmup: int = 1, fidelity: bool = True, progress=None) -> dict:
    """Benchmarks `methods` on `prompts` (dicts {task, prompt} or strings); returns the result dict.

    `progress(message, fraction)` is called after every run.
    """
    config = config or DecodeConfig()
    prompts = _as_prompts(prompts)
    methods = list(dict.fromkeys(methods))
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown methods {unknown}: use some of {', '.join(BENCH_METHODS)}")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    report = progress or (lambda message, fraction: None)
    machine = machine_info(pair)
    warm_cfg = replace(config, max_new_tokens=min(config.max_new_tokens, 16))
    for w in range(warmup):  # first calls pay for allocation and lazy initialisation
        for method in methods:
            run_once(pair, prompts[0]["prompt"], method, warm_cfg)
        report(f"warm-up {w + 1}/{warmup} done", 0.0)
    runs, total, order = [], repeats * len(prompts) * len(methods), 0
    for rep in range(repeats):
        for i, p in enumerate(prompts):
            # rotate the order so no method always runs first (or right after the same neighbour)
            for method in _rotated(methods, rep * len(prompts) + i):
                record, _ = run_once(pair, p["prompt"], method, config)
                record.update(prompt_index=i, task=p["task"], repeat=rep, order=order)
                runs.append(record)
                order += 1
                report(f"repeat {rep + 1}/{repeats}, prompt {i + 1}/{len(prompts)} ({p['task']}), {method}: "
                       f"{record['tokens_per_s']:.2f} tokens/s", order / total)
    if fidelity:
        _score_runs(pair, runs, prompts, config, progress=report, reference="ar" if "ar" in methods else None)
    result = {
        "schema": SCHEMA, "kind": "bench", "machine": {**machine, "load_average_at_end": list(os.getloadavg())},
        "models": pair.describe(),
        "config": config.to_dict(), "methods": methods, "repeats": repeats, "warmup": warmup,
        "tokens_per_s_counts": "new tokens / wall time of the whole call (encoding and prefill included)",
        "prompts": [{"index": i, "task": p["task"], "prompt": p["prompt"]} for i, p in enumerate(prompts)],
        "runs": runs,
    }
    summarize_bench(result)
    return result


def summarize_bench(result: dict) -> dict:
    """(Re)computes summary, per-prompt ratios, costs and targets from `result["runs"]`."""
    runs, methods = result["runs"], result["methods"]
    ar = "ar" if "ar" in methods else None
    sd = "sd" if "sd" in methods else None
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    summary = {}
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        summary[m] = {"all": metrics(mine, runs, ar=ar, sd=sd)}
        for task in tasks:
            group = [r for r in mine if r["task"] == task]
            context = [r for r in runs if r["task"] == task]
            summary[m][task] = metrics(group, context, ar=ar, sd=sd)
    result["summary"] = summary
    per_prompt = []
    for i in sorted({r["prompt_index"] for r in runs}):
        here = [r for r in runs if r["prompt_index"] == i]
        row = {"prompt_index": i, "task": here[0]["task"], "methods": {}}
        for m in methods:
            mine = [r for r in here if r["method"] == m]
            row["methods"][m] = {
                "tokens_per_s": _median([r["tokens_per_s"] for r in mine]),
                "speedup_vs_ar": _ratio(here, m, ar) if ar else None,
                "speedup_vs_sd": _ratio(here, m, sd) if sd else None,
                "agreement": _median([r.get("agreement") for r in mine]),
                "identical_to_ar": _share(mine, "identical_to_ar"),
            }
        per_prompt.append(row)
    result["per_prompt"] = per_prompt
    result["targets"] = targets(result)
    result["analysis"] = analysis(result)
    return result


def targets(result: dict) -> dict:
    """The issue's targets: SD >= HF with identical output; VIA >= 1.10x SD, agreement >= 0.95,
    rejection rate >= 0.10 below SD's."""
    s, runs, out = result["summary"], result["runs"], {}
    if "sd" in s and "hf" in s:
        ratio = _ratio(runs, "sd", "hf")
        sd_ids = {_key(r): r["token_ids"] for r in runs if r["method"] == "sd"}
        # sampled outputs differ by design (two random streams); only greedy ones must match
        same = all(r["token_ids"] == sd_ids.get(_key(r)) for r in runs if r["method"] == "hf") \
            if result["config"]["temperature"] == 0 else None
        out["sd_vs_hf"] = {"speed_ratio": ratio, "identical_output": same,
                           "met": bool(ratio is not None and ratio >= 1.0 and same is not False)}
    if "sd" in s and "via" in s:
        via, sd = s["via"]["all"], s["sd"]["all"]
        drop = (sd["rejection_rate"] - via["rejection_rate"]
                if sd["rejection_rate"] is not None and via["rejection_rate"] is not None else None)
        checks = {"speedup_vs_sd": via["speedup_vs_sd"], "agreement": via["agreement"], "rejection_drop": drop}
        out["via_vs_sd"] = {**checks, "met": bool(
            checks["speedup_vs_sd"] is not None and checks["speedup_vs_sd"] >= 1.10
            and (checks["agreement"] is None or checks["agreement"] >= FIDELITY_TARGET)
            and drop is not None and drop >= 0.10),
            "parts": {"speed": via["speedup_vs_sd"] is not None and via["speedup_vs_sd"] >= 1.10,
                      "fidelity": via["agreement"] is not None and via["agreement"] >= FIDELITY_TARGET,
                      "rejection": drop is not None and drop >= 0.10}}
    return out


def analysis(result: dict) -> dict:
    """Where the time goes: per-call costs, their ratios, and what VIA-SD would need to reach 1.10x SD."""
    s = result["summary"]
    get = lambda m, *keys: _dig(s.get(m, {}).get("all"), *keys)  # noqa: E731
    costs = {
        "drafter_ms_per_call": get("sd", "ms_per_call", "drafter") or get("via", "ms_per_call", "drafter"),
        "full_ms_per_call_ar": get("ar", "ms_per_call", "full"),
        "full_ms_per_call_sd": get("sd", "ms_per_call", "full"),
        "full_tokens_per_call_sd": get("sd", "tokens_per_call", "full"),
        "slim_ms_per_call_via": get("via", "ms_per_call", "slim"),
        "slim_tokens_per_call_via": get("via", "tokens_per_call", "slim"),
        "full_ms_per_call_via": get("via", "ms_per_call", "full"),
        "full_tokens_per_call_via": get("via", "tokens_per_call", "full"),
    }
    div = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    costs["ratio_drafter_to_full_ar"] = div(costs["drafter_ms_per_call"], costs["full_ms_per_call_ar"])
    costs["ratio_full_sd_to_full_ar"] = div(costs["full_ms_per_call_sd"], costs["full_ms_per_call_ar"])
    costs["ratio_slim_to_full_sd"] = div(costs["slim_ms_per_call_via"], costs["full_ms_per_call_sd"])
    out = {"costs": costs}
    if "via" in s and "sd" in s and get("via", "ms_per_token") and get("sd", "ms_per_token"):
        via_ms, sd_ms = get("via", "ms_per_token"), get("sd", "ms_per_token")
        t_sd, t_via = sum(sd_ms.values()), sum(via_ms.values())
        slim_per_token = get("via", "slim_calls_per_token") or 0.0
        budget = t_sd / 1.10 - (t_via - via_ms["slim"])  # what the slim passes may cost for 1.10x
        out["via_gap"] = {
            "ms_per_token_sd": t_sd, "ms_per_token_via": t_via,
            "ms_per_token_by_phase": {"sd": sd_ms, "via": via_ms},
            "full_calls_per_token": {m: get(m, "full_calls_per_token") for m in ("sd", "via")},
            "slim_calls_per_token_via": slim_per_token,
            # slim cost per call that would give 1.10x with everything else as measured (<= 0: impossible)
            "slim_ms_per_call_for_target": budget / slim_per_token if slim_per_token else None,
            "slim_to_full_ratio_for_target": div(budget / slim_per_token if slim_per_token else None,
                                                 costs["full_ms_per_call_sd"]),
        }
    return out


def _dig(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


# ---- sweep ---------------------------------------------------------------------------------------

def pareto(points: list[dict], x: str = "fidelity", y: str = "speedup") -> list[dict]:
    """Points no other point beats on both `x` and `y` (ties kept), sorted by `x`."""
    valid = [p for p in points if p.get(x) is not None and p.get(y) is not None]
    front = [p for p in valid if not any(q[x] >= p[x] and q[y] >= p[y] and (q[x] > p[x] or q[y] > p[y])
                                         for q in valid)]
    return sorted(front, key=lambda p: (p[x], -p[y]))


def _route_label(route) -> str:
    return route.name if route.name != "custom" else ",".join(route.skip) or "none"


def run_sweep(pair, prompts, config: DecodeConfig | None = None, accept=(0.5, 0.7, 0.9), escalate=(0.0, 0.2, 0.4),
              signals=("slim", "draft"), routes=None, repeats: int = 1, warmup: int = 1, progress=None) -> dict:
    """VIA-SD over a threshold grid (escalate <= accept) per signal and route, against plain SD
    measured in the same interleaved run. Returns points (speed-up vs SD, fidelity), the frontier
    and the fastest point with agreement >= 0.95.

    `routes`: list of anything `pair.set_route` takes; None keeps the pair's route. Under greedy
    decoding a point's output is deterministic, so fidelity needs one forward per distinct output.
    """
    config = config or DecodeConfig()
    prompts = _as_prompts(prompts)
    report = progress or (lambda message, fraction: None)
    machine = machine_info(pair)
    original = pair.slim
    route_list = list(routes) if routes else [None]
    settings = [(route, signal, a, e) for route in route_list for signal in signals
                for a in accept for e in escalate if e <= a + 1e-9]
    if not settings:
        raise ValueError("the sweep grid is empty: every escalate value is above every accept value")

    def via_config(setting):
        _, signal, a, e = setting
        return replace(config, thresholds=Thresholds(accept=a, escalate=min(e, a), signal=signal))

    def use_route(route):
        pair.slim = original
        if route is not None:
            pair.set_route(route)

    runs, points_meta = [], []
    try:
        for setting in settings:
            use_route(setting[0])
            points_meta.append({"route": _route_label(pair.route), "skipped": list(pair.route.skip),
                                "skip_fraction": pair.route.skip_fraction, "signal": setting[1],
                                "accept": setting[2], "escalate": setting[3]})
        warm_cfg = replace(config, max_new_tokens=min(config.max_new_tokens, 16))
        for _ in range(warmup):
            run_once(pair, prompts[0]["prompt"], "sd", warm_cfg)
            use_route(settings[0][0])
            run_once(pair, prompts[0]["prompt"], "via", replace(via_config(settings[0]), max_new_tokens=16))
        labels = ["sd"] + [f"point{k}" for k in range(len(settings))]
        total, done = repeats * len(prompts) * len(labels), 0
        for rep in range(repeats):
            for i, p in enumerate(prompts):
                for label in _rotated(labels, rep * len(prompts) + i):
                    if label == "sd":
                        record, _ = run_once(pair, p["prompt"], "sd", config)
                    else:
                        setting = settings[int(label[5:])]
                        use_route(setting[0])
                        record, _ = run_once(pair, p["prompt"], "via", via_config(setting))
                    record.update(label=label, prompt_index=i, task=p["task"], repeat=rep, order=done)
                    runs.append(record)
                    done += 1
                    report(f"sweep {done}/{total}: {label} on prompt {i + 1}: {record['tokens_per_s']:.2f} tokens/s",
                           done / total)
    finally:
        pair.slim = original
    # SD's greedy output is the full model's own, so it is the fidelity reference
    _score_runs(pair, runs, prompts, config, progress=report, label="label", reference="sd")
    sd = metrics([r for r in runs if r["label"] == "sd"], runs, label="label", ar=None, sd="sd", reference="sd")
    points = []
    for k, meta in enumerate(points_meta):
        m = metrics([r for r in runs if r["label"] == f"point{k}"], runs, label="label", ar=None, sd="sd",
                    reference="sd")
        points.append({**meta, "speedup": m["speedup_vs_sd"], "fidelity": m["agreement"],
                       "tokens_per_s": m["tokens_per_s"], "mean_logprob": m["mean_logprob"],
                       "logprob_delta_vs_sd": m["logprob_delta_vs_sd"], "identical_to_sd": m["identical_to_sd"],
                       "rejection_rate": m["rejection_rate"], "mean_accepted_length": m["mean_accepted_length"],
                       "full_calls_per_token": m["full_calls_per_token"],
                       "slim_calls_per_token": m["slim_calls_per_token"], "tier_shares": m["tier_shares"]})
    front = pareto(points)
    for p in points:
        p["pareto"] = p in front
    good = [p for p in points if p["fidelity"] is not None and p["fidelity"] >= FIDELITY_TARGET
            and p["speedup"] is not None]
    best = max(good, key=lambda p: p["speedup"]) if good else None
    return {
        "schema": SCHEMA, "kind": "sweep", "machine": {**machine, "load_average_at_end": list(os.getloadavg())},
        "models": pair.describe(),
        "config": config.to_dict(), "repeats": repeats, "warmup": warmup, "baseline": "sd",
        "speedup_is": "median paired tokens/s ratio VIA-SD / plain SD (same prompt, same repeat)",
        "fidelity_is": "full-model top-1 agreement on the emitted tokens (teacher-forced)",
        "prompts": [{"index": i, "task": p["task"], "prompt": p["prompt"]} for i, p in enumerate(prompts)],
        "sd": {"method": "sd", "speedup": 1.0, "fidelity": sd["agreement"], "tokens_per_s": sd["tokens_per_s"],
               "rejection_rate": sd["rejection_rate"], "mean_accepted_length": sd["mean_accepted_length"]},
        "points": points, "frontier": front, "best": best, "runs": runs,
    }


# ---- projection from measured per-call costs (e.g. the GPU script) -------------------------------

def _interpolate(lengths: list[int], ms: list[float], n: int) -> float:
    """Piecewise-linear cost of a forward over n tokens; the end segments extend beyond the grid."""
    pts = sorted(zip(lengths, ms))
    if len(pts) == 1:
        return pts[0][1]
    k = next((k for k in range(1, len(pts)) if n <= pts[k][0]), len(pts) - 1)
    (x0, y0), (x1, y1) = pts[k - 1], pts[k]
    return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), 0.0)


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
        ms = sum(_interpolate(lengths, table[m], n) for m in MODELS for n in r["call_lengths"][m])
        per_run.append({k: r[k] for k in ("method", "prompt_index", "repeat", "task")} | {
            "tokens_per_s": 1000.0 * r["new_tokens"] / ms if ms else 0.0, "ms": ms})
    methods = list(dict.fromkeys(p["method"] for p in per_run))
    summary = {m: {"tokens_per_s": _median([p["tokens_per_s"] for p in per_run if p["method"] == m]),
                   "speedup_vs_ar": _ratio(per_run, m, "ar") if "ar" in methods else None,
                   "speedup_vs_sd": _ratio(per_run, m, "sd") if "sd" in methods else None} for m in methods}
    return {"label": f"projected: acceptance and tiers measured on {result['models'].get('verifier')} "
                     f"({result['machine'].get('device')}), forward costs measured on {costs.get('device_name')} "
                     f"for the {costs.get('pair')} pair configs ({costs.get('dtype')}); forward passes only",
            "costs_source": {k: costs.get(k) for k in ("pair", "device", "device_name", "dtype", "context")},
            "summary": summary, "runs": per_run, "notes": sorted(set(notes))}


# ---- report --------------------------------------------------------------------------------------

NAMES = {"ar": "AR", "sd": "SD", "via": "VIA-SD", "hf": "HF assisted"}


def _f(value, fmt="{:.2f}", none="–"):
    return none if value is None else fmt.format(value)


def markdown(result: dict) -> str:
    """The bench result as markdown: per task, per position, where the time goes, projection,
    targets, and the summary table last."""
    s, cfg = result["summary"], result["config"]
    th, methods = cfg["thresholds"], result["methods"]
    lines = []
    tasks = [t for t in s[methods[0]] if t != "all"]
    if len(tasks) > 1:
        both, hf = "via" in methods and "sd" in methods, "sd" in methods and "hf" in methods
        lines += ["| task | " + " | ".join(f"{NAMES[m]} tokens/s" for m in methods)
                  + (" | VIA-SD × SD | VIA-SD agreement" if both else "") + (" | SD × HF" if hf else "") + " |",
                  "|---|" + "---|" * (len(methods) + 2 * both + hf)]
        for t in tasks:
            row = [_f(s[m][t]["tokens_per_s"]) for m in methods]
            if both:
                row += [_f(s["via"][t]["speedup_vs_sd"], "{:.2f}×"), _f(s["via"][t]["agreement"], "{:.3f}")]
            if hf:
                row.append(_f(_ratio([r for r in result["runs"] if r["task"] == t], "sd", "hf"), "{:.2f}×"))
            lines.append(f"| {t} | " + " | ".join(row) + " |")
        lines.append("")
    if any(s[m]["all"]["acceptance_by_position"] for m in methods):
        lines += ["Per-position acceptance (share of drafts at position k kept):", "",
                  "| method | " + " | ".join(f"k={k}" for k in range(1, cfg["gamma"] + 1)) + " |",
                  "|---|" + "---|" * cfg["gamma"]]
        for m in methods:
            acc = s[m]["all"]["acceptance_by_position"]
            if acc and any(v is not None for v in acc):
                lines.append(f"| {NAMES[m]} | " + " | ".join(_f(v) for v in acc) + " |")
        lines.append("")
    lines += [*_time_md(result), ""]
    if result.get("projection"):
        p = result["projection"]
        lines += [f"**Projected** ({p['label']}):", "", "| method | projected tokens/s | × AR | × SD |",
                  "|---|---|---|---|"]
        for m, v in p["summary"].items():
            lines.append(f"| {NAMES.get(m, m)} | {_f(v['tokens_per_s'], '{:.1f}')} | "
                         f"{_f(v['speedup_vs_ar'], '{:.2f}×')} | {_f(v['speedup_vs_sd'], '{:.2f}×')} |")
        lines += [f"- {n}" for n in p["notes"]] + [""]
    lines += [*_targets_md(result), ""]
    lines += [f"**{result['models']['drafter']} → {result['models']['verifier']}**, route "
              f"`{result['models']['route']}` ({len(result['models']['skipped'])} sub-layers skipped), "
              f"{result['machine']['device']} {result['machine']['dtype']}, gamma {cfg['gamma']}, "
              f"{cfg['max_new_tokens']} new tokens, temperature {cfg['temperature']}, thresholds accept "
              f"{th['accept']} / escalate {th['escalate']} (signal {th['signal']}), {len(result['prompts'])} "
              f"prompt(s) × {result['repeats']} repeat(s); medians, speed-ups from paired runs; peak memory: "
              f"{s[methods[0]]['all']['peak_memory_kind']}.", "",
              "| method | tokens/s | × AR | × SD | accepted length | rejection rate | full calls / token | "
              "tiers draft/slim/full | agreement | Δ log-prob vs AR | same output as AR | peak memory (MiB) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        a = s[m]["all"]
        tiers = "/".join(f"{100 * a['tier_shares'][t]:.0f}%" for t in ("draft", "slim", "full")) \
            if a["tier_shares"] else "–"
        lines.append(f"| {NAMES[m]} | {_f(a['tokens_per_s'])} | {_f(a['speedup_vs_ar'], '{:.2f}×')} | "
                     f"{_f(a['speedup_vs_sd'], '{:.2f}×')} | {_f(a['mean_accepted_length'])} | "
                     f"{_f(a['rejection_rate'])} | {_f(a['full_calls_per_token'])} | {tiers} | "
                     f"{_f(a['agreement'], '{:.3f}')} | {_f(a['logprob_delta_vs_ar'], '{:+.3f}')} | "
                     f"{_f(a['identical_to_ar'], '{:.0%}')} | {_f(a['peak_memory_mb'], '{:.0f}')} |")
    return "\n".join(lines)


def _targets_md(result: dict) -> list[str]:
    t, out = result["targets"], ["Targets:"]
    if "sd_vs_hf" in t:
        x = t["sd_vs_hf"]
        output = {True: "identical", False: "DIFFERENT", None: "sampled (not compared)"}[x["identical_output"]]
        out.append(f"- SD vs HF assisted generation: {_f(x['speed_ratio'], '{:.2f}×')} (target ≥ 1.00×), output "
                   f"{output} — {'met' if x['met'] else 'MISSED'}")
    if "via_vs_sd" in t:
        x = t["via_vs_sd"]
        missed = ", ".join(k for k, v in x["parts"].items() if not v)
        out.append(f"- VIA-SD vs SD: {_f(x['speedup_vs_sd'], '{:.2f}×')} (target ≥ 1.10×), agreement "
                   f"{_f(x['agreement'], '{:.3f}')} (≥ 0.95), rejection rate lower by {_f(x['rejection_drop'])} "
                   f"(≥ 0.10) — {'met' if x['met'] else f'MISSED ({missed})'}")
    return out if len(out) > 1 else []


def _time_md(result: dict) -> list[str]:
    s, a = result["summary"], result["analysis"]
    traced = [m for m in result["methods"] if s[m]["all"]["phase_shares"]]
    if not traced:
        return []
    out = ["Where the time goes (ms per emitted token, by phase; share of wall time in brackets):", "",
           "| method | " + " | ".join(PHASES) + " | total |", "|---|" + "---|" * (len(PHASES) + 1)]
    for m in traced:
        ms, sh = s[m]["all"]["ms_per_token"], s[m]["all"]["phase_shares"]
        out.append(f"| {NAMES[m]} | " + " | ".join(f"{ms[p]:.0f} ({100 * sh[p]:.0f}%)" for p in PHASES)
                   + f" | {sum(ms.values()):.0f} |")
    c = a["costs"]
    out += ["", "Forward-pass costs (ms per call, mean tokens fed per call):", "",
            f"- drafter: {_f(c['drafter_ms_per_call'], '{:.1f}')} ms/call; full verifier at 1 token (AR): "
            f"{_f(c['full_ms_per_call_ar'], '{:.1f}')} ms; full verifier verifying (SD, "
            f"{_f(c['full_tokens_per_call_sd'], '{:.1f}')} tokens): {_f(c['full_ms_per_call_sd'], '{:.1f}')} ms; "
            f"slim verifier (VIA, {_f(c['slim_tokens_per_call_via'], '{:.1f}')} tokens): "
            f"{_f(c['slim_ms_per_call_via'], '{:.1f}')} ms; full verifier in VIA "
            f"({_f(c['full_tokens_per_call_via'], '{:.1f}')} tokens): {_f(c['full_ms_per_call_via'], '{:.1f}')} ms.",
            f"- ratios: drafter / full(1 token) = {_f(c['ratio_drafter_to_full_ar'])}, "
            f"full(verify) / full(1 token) = {_f(c['ratio_full_sd_to_full_ar'])}, "
            f"slim / full(verify) = {_f(c['ratio_slim_to_full_sd'])}."]
    g = a.get("via_gap")
    if g:
        out.append(f"- VIA-SD {g['ms_per_token_via']:.0f} ms/token vs SD {g['ms_per_token_sd']:.0f}; full calls per "
                   f"token {_f(g['full_calls_per_token']['via'])} vs {_f(g['full_calls_per_token']['sd'])}, plus "
                   f"{_f(g['slim_calls_per_token_via'])} slim calls per token. For 1.10× SD with everything else as "
                   f"measured, a slim call may cost at most {_f(g['slim_ms_per_call_for_target'], '{:.0f}')} ms "
                   f"(slim / full(verify) ≤ {_f(g['slim_to_full_ratio_for_target'])}; ≤ 0 means unreachable "
                   "by a cheaper slim pass alone).")
    return out


def _best_md(b: dict | None) -> str:
    if b is None:
        return f"No point reached agreement ≥ {FIDELITY_TARGET}."
    return (f"Fastest with agreement ≥ {FIDELITY_TARGET}: route {b['route']}, signal {b['signal']}, accept "
            f"{b['accept']:.2f}, escalate {b['escalate']:.2f}: {_f(b['speedup'], '{:.2f}×')} SD, agreement "
            f"{b['fidelity']:.3f}.")


def markdown_sweep(sweep: dict) -> str:
    cfg = sweep["config"]
    sd = sweep["sd"]
    lines = [f"Threshold sweep: {len(sweep['prompts'])} prompts × {sweep['repeats']} repeats, gamma {cfg['gamma']}, "
             f"{cfg['max_new_tokens']} new tokens; speed-up = median paired tokens/s ratio over plain SD "
             f"({_f(sd['tokens_per_s'])} tokens/s, agreement {_f(sd['fidelity'], '{:.3f}')}); fidelity = full-model "
             "top-1 agreement. ★ = on the speed-up vs fidelity frontier.", "", _best_md(sweep["best"]), "",
             "| route | signal | accept | escalate | × SD | agreement | rejection rate | accepted length | "
             "full calls / token | slim calls / token | tiers draft/slim/full | frontier |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(sweep["points"], key=lambda p: -(p["speedup"] or 0)):
        tiers = "/".join(f"{100 * p['tier_shares'][t]:.0f}%" for t in ("draft", "slim", "full"))
        lines.append(f"| {p['route']} | {p['signal']} | {p['accept']:.2f} | {p['escalate']:.2f} | "
                     f"{_f(p['speedup'], '{:.2f}×')} | {_f(p['fidelity'], '{:.3f}')} | {_f(p['rejection_rate'])} | "
                     f"{_f(p['mean_accepted_length'])} | {_f(p['full_calls_per_token'])} | "
                     f"{_f(p['slim_calls_per_token'])} | {tiers} | {'★' if p['pareto'] else ''} |")
    lines.append(f"| SD | – | – | – | 1.00× | {_f(sd['fidelity'], '{:.3f}')} | {_f(sd['rejection_rate'])} | "
                 f"{_f(sd['mean_accepted_length'])} | – | – | – | |")
    return "\n".join(lines)


# ---- command line --------------------------------------------------------------------------------

def add_parser(sub, add_pair_arguments, add_decode_arguments) -> None:
    p = sub.add_parser("bench", help="benchmark AR, SD, VIA-SD and HF assisted generation side by side")
    add_pair_arguments(p)
    add_decode_arguments(p)
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSON lines {task, prompt} (default: mixed)")
    p.add_argument("--tasks", help="only these tasks, comma-separated")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--methods", default="ar,sd,via,hf", help="comma-separated, from ar,sd,via,hf")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds of every method before timing")
    p.add_argument("--no-fidelity", action="store_true", help="skip the full-model fidelity pass")
    p.add_argument("--sweep", help="threshold grid, e.g. accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1")
    p.add_argument("--signals", help="sweep these signals (default: slim,draft)")
    p.add_argument("--routes", nargs="+", help="sweep these slim routes (names, .json files or attn.3,attn.4 lists)")
    p.add_argument("--gpu-costs", help="forward costs from scripts/gpu_check.py: add a projected speed-up")
    p.add_argument("--json", help="write every run and the summary to this file")
    p.add_argument("--markdown", help="also write the markdown table to this file")
    p.set_defaults(run=cmd_bench)


def _route_arg(text: str):
    return [s.strip() for s in text.split(",") if s.strip()] if "," in text or text.startswith(("attn.", "mlp.")) \
        else text


def cmd_bench(args) -> int:
    from .__main__ import config_from_args, pair_from_args

    prompts = load_prompts(args.prompts, tasks=args.tasks.split(",") if args.tasks else None, limit=args.limit)
    config = config_from_args(args)
    costs = None
    if args.gpu_costs:
        costs = json.loads(Path(args.gpu_costs).read_text())
    pair = pair_from_args(args)

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    started = time.time()
    if args.sweep or args.routes:
        grid = parse_grid(args.sweep) if args.sweep else {}
        th = config.thresholds
        signals = args.signals.split(",") if args.signals else (["slim", "draft"] if args.sweep else [th.signal])
        result = run_sweep(pair, prompts, config, accept=grid.get("accept", [th.accept]),
                           escalate=grid.get("escalate", [th.escalate]), signals=signals,
                           routes=[_route_arg(r) for r in args.routes] if args.routes else None,
                           repeats=args.repeats, warmup=args.warmup, progress=progress)
        text = markdown_sweep(result)
    else:
        result = run_bench(pair, prompts, methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                           config=config, repeats=args.repeats, warmup=args.warmup, fidelity=not args.no_fidelity,
                           progress=progress)
        if costs:
            result["projection"] = project(result, costs)
        text = markdown(result)
    result["elapsed_s"] = time.time() - started
    result["command"] = "python -m via_sd " + " ".join(sys.argv[1:])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"results written to {args.json}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0

