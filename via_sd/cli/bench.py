"""`python -m via_sd bench`: the benchmark and threshold sweep from the command line (code: via_sd/bench/)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..bench import DEFAULT_PROMPTS, load_prompts, markdown, markdown_sweep, parse_grid, project, run_bench, run_sweep
from ..bench.jobs import write_json
from ..bench.run import without_missing_peers
from .args import (add_decode_arguments, add_pair_arguments, config_from_args, pair_from_args, parse_route,
                   print_progress)
from .cluster import add_cluster_arguments, cluster_bench


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark AR, SD, VIA-SD and HF assisted generation side by side")
    add_pair_arguments(p)
    add_decode_arguments(p)
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSON lines {task, prompt} (default: mixed)")
    p.add_argument("--tasks", help="only these tasks, comma-separated")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--methods", default="ar,sd,via,hf", help="comma-separated, from ar,sd,via,hf, per drafter "
                   "sd-lookup,sd-hybrid,sd-exit,via-lookup,via-hybrid,via-exit and transformers' hf-lookup,hf-exit, "
                   "and the optional llama.cpp peer llama-ar,llama-sd,llama-lookup (pip install -r requirements-peers.txt)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds of every method before timing")
    p.add_argument("--no-fidelity", action="store_true", help="skip the full-model fidelity pass")
    p.add_argument("--sweep", help="threshold grid, e.g. accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1")
    p.add_argument("--signals", help="sweep these signals (default: slim,draft)")
    p.add_argument("--routes", nargs="+", help="sweep these slim routes (names, .json files or attn.3,attn.4 lists)")
    p.add_argument("--gpu-costs", help="forward costs from scripts/gpu_check.py: add a projected speed-up")
    p.add_argument("--json", help="write every run and the summary to this file, before any table is formatted "
                   "(default: bench-<date>-<time>.json here)")
    p.add_argument("--markdown", help="also write the markdown table to this file")
    add_cluster_arguments(p)
    p.set_defaults(run=cmd_bench)


def cmd_bench(args) -> int:
    prompts = load_prompts(args.prompts, tasks=args.tasks.split(",") if args.tasks else None, limit=args.limit)
    config = config_from_args(args)
    costs = None
    if args.gpu_costs:
        costs = json.loads(Path(args.gpu_costs).read_text())
    if args.cluster or args.resume:  # spread over a Ray cluster, or resumable here (cli/cluster.py): Ray only then
        return cluster_bench(args, prompts, config, sweep_grid(args, config), _report)
    if "," in getattr(args, "weights", "auto"):  # weights settings side by side (via_sd/bench/weights.py)
        return _bench_weights(args, prompts, config)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if methods and not without_missing_peers(None, methods)[0]:  # only peers, not installed: said so; load nothing
        return 0
    pair = pair_from_args(args)
    started = time.time()
    if args.sweep or args.routes:
        result = run_sweep(pair, prompts, config, **sweep_grid(args, config), repeats=args.repeats,
                           warmup=args.warmup, progress=print_progress)
    else:
        result = run_bench(pair, prompts, methods=methods,
                           config=config, repeats=args.repeats, warmup=args.warmup, fidelity=not args.no_fidelity,
                           progress=print_progress)
        if costs:
            result["projection"] = project(result, costs)
    return _report(args, result, started, markdown_sweep if args.sweep or args.routes else markdown)


def sweep_grid(args, config) -> dict | None:
    """run_sweep's grid arguments from --sweep, --signals and --routes (None: no sweep asked for)."""
    if not (args.sweep or args.routes):
        return None
    grid = parse_grid(args.sweep) if args.sweep else {}
    th = config.thresholds
    signals = args.signals.split(",") if args.signals else (["slim", "draft"] if args.sweep else [th.signal])
    return {"accept": grid.get("accept", [th.accept]), "escalate": grid.get("escalate", [th.escalate]),
            "signals": signals, "routes": [parse_route(r) for r in args.routes] if args.routes else None}


def _report(args, result: dict, started: float, formatter) -> int:
    """Writes every measured run as JSON first, then formats the tables: a report that fails loses no run."""
    result["elapsed_s"] = time.time() - started
    result["command"] = "python -m via_sd " + " ".join(sys.argv[1:])
    path = args.json or f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"  # never only in memory
    write_json(Path(path), result)  # atomically: a crash mid-write keeps the file as it was
    print(f"results written to {path}", file=sys.stderr)
    try:
        text = formatter(result)
    except Exception as err:  # the runs are on disk: say where, and fail
        print(f"the report could not be formatted ({type(err).__name__}: {err}); every run is in {path}",
              file=sys.stderr)
        return 1
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def _bench_weights(args, prompts, config) -> int:
    from ..bench.weights import markdown_weights, run_weights_bench

    settings = [w.strip() for w in args.weights.split(",") if w.strip()]
    pairs = {w: pair_from_args(args, weights=w) for w in settings}
    methods = [m.strip() for m in args.methods.split(",") if m.strip() and m.strip() != "hf"]
    started = time.time()
    result = run_weights_bench(pairs, prompts, methods=methods, config=config, repeats=args.repeats,
                               warmup=args.warmup, progress=print_progress)
    return _report(args, result, started, markdown_weights)
