"""`python -m via_sd bench ... --cluster auto`: the bench and the sweep on a Ray cluster (code: via_sd/bench/
cluster.py, spread.py; how to start one: docs/cluster.md). Ray is imported only once the flag is given."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .args import pair_spec, print_progress


def add_cluster_arguments(parser) -> None:
    parser.add_argument("--cluster", metavar="auto|ADDRESS",
                        help="run on a Ray cluster: auto (RAY_ADDRESS, else a local one) or its address; the --json "
                        "file fills as runs finish, and the same command again resumes it "
                        "(pip install -r requirements-cluster.txt; docs/cluster.md)")
    parser.add_argument("--resume", action="store_true",
                        help="without --cluster: write each finished prompt's runs into --json at once, and run again "
                        "with the same --json, skip what it holds (--cluster always does)")
    parser.add_argument("--cluster-workers", type=int, metavar="N",
                        help="at most N workers (default: as many as the nodes' CPUs, GPUs and memory hold)")


def cluster_bench(args, prompts: list[dict], config, grid: dict | None, report) -> int:
    """The bench (or the sweep, `grid`) on the cluster, or resumable in this process (`--resume` alone);
    `report(args, result, started, formatter)` writes it."""
    if args.cluster:
        from ..bench.cluster import ray_missing

        why = ray_missing()
        if why:
            print(why, file=sys.stderr)
            return 2
    from ..bench import markdown, markdown_sweep, project
    from ..bench.run import without_missing_peers
    from ..bench.spread import run_cluster_bench, run_cluster_sweep

    if "," in getattr(args, "weights", "auto"):
        raise ValueError("--weights: one setting with --cluster (a comma list compares settings on one machine)")
    if args.cluster_workers is not None and args.cluster_workers < 1:
        raise ValueError(f"--cluster-workers must be at least 1, got {args.cluster_workers}")
    args.json = args.json or f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"  # filled as runs finish
    started = time.time()
    with _workers(args) as cluster:
        if grid:
            result = run_cluster_sweep(cluster, prompts, config, **grid, repeats=args.repeats, warmup=args.warmup,
                                       json_path=args.json, progress=print_progress)
            return report(args, result, started, markdown_sweep)
        methods, skipped = without_missing_peers(None, [m.strip() for m in args.methods.split(",") if m.strip()])
        result = run_cluster_bench(cluster, prompts, methods, config, repeats=args.repeats, warmup=args.warmup,
                                   fidelity=not args.no_fidelity, json_path=args.json, progress=print_progress,
                                   skipped=skipped)
    if args.gpu_costs:
        result["projection"] = project(result, json.loads(Path(args.gpu_costs).read_text()))
    return report(args, result, started, markdown)


def _workers(args):
    if not args.cluster:
        from ..bench.worker import InProcess

        return InProcess(pair_spec(args))
    from ..bench.cluster import Cluster

    return Cluster(pair_spec(args), args.cluster, args.cluster_workers, progress=print_progress)
