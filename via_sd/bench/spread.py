"""The bench and the threshold sweep spread over a cluster's workers (cluster.py; or worker.InProcess, this
process alone): the local bench's groups of paired runs, each group on one worker, streamed into the bench JSON
as they finish and resumed from it; the fidelity pass shared out too; the result summarized as run_bench's is.

    with Cluster({"preset": "embedded"}, "auto") as cluster:
        result = run_cluster_bench(cluster, prompts, ["ar", "sd", "via"], config, repeats=2, json_path="b.json")
"""

from __future__ import annotations

import hashlib
import json

from ..core.decoding import DecodeConfig
from .inputs import as_prompts
from .jobs import ProgressLine, RunLog, plan_groups
from .run import BENCH_METHODS, apply_scores, bench_result, distinct_outputs
from .sweep import _settings, sweep_labels, sweep_result


def _plan(kind: str, cluster, config: DecodeConfig, prompts: list[dict], labels: list[str], repeats: int,
          warmup: int, **more) -> dict:
    return {"kind": kind, "pair": cluster.spec, "config": config.to_dict(), "prompts": prompts, "labels": labels,
            "repeats": repeats, "warmup": warmup, **more}


def _measure(cluster, log: RunLog, job: dict, report, stop) -> bool:
    """Every group not yet in the log, on the workers; each finished group into the log at once. True: stopped."""
    plan = log.plan
    groups = plan_groups(len(plan["prompts"]), plan["repeats"], plan["labels"])
    done = log.done()
    todo = [g for g in groups if (g["repeat"], g["prompt_index"]) not in done]
    per = len(plan["labels"])
    if todo:
        cluster.start()  # before the clock of the progress line starts: rates count measuring, not loading
    line = ProgressLine(len(groups) * per, (len(groups) - len(todo)) * per, report)
    if not todo:
        report(f"all {len(groups) * per} runs are in {log.path} already: nothing to run", 1.0)
        return False
    if done:
        report(f"resuming {log.path}: {len(done) * per} runs done, {len(todo) * per} to go", 0.0)

    def finished(worker, group, runs):
        if "machine" not in log.meta:  # what the report's header names; each run records its own machine
            log.meta.update(machine=worker.info["machine_info"], models=worker.info["models"])
        log.add(runs)
        line.ran(worker.name, len(runs))

    job = {**job, "id": hashlib.sha1(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:12]}
    return cluster.map(todo, "run_group", lambda group: (job, group), finished, stop)


def _score(cluster, runs: list[dict], prompts: list[dict], config: DecodeConfig, label: str, reference, report):
    """Fidelity of every run: outputs scored before (a resumed file) are kept, the rest scored by the workers,
    one job per prompt (its prompt read once)."""
    scores = {(r["prompt_index"], tuple(r["token_ids"])): {"agreement": r["agreement"], "agreeing": r["agreeing"],
                                                          "tokens": r["scored_tokens"],
                                                          "mean_logprob": r["mean_logprob"],
                                                          "first_disagreement": r["first_disagreement"]}
              for r in runs if "scored_tokens" in r}
    todo = [k for k in distinct_outputs(runs) if k not in scores]
    jobs = [(i, [list(ids) for p, ids in todo if p == i]) for i in sorted({p for p, _ in todo})]
    if jobs:
        report(f"fidelity of {len(todo)} distinct output(s) on the workers", 1.0)

    def scored(worker, job, results):
        scores.update({(job[0], tuple(ids)): s for ids, s in zip(job[1], results)})

    cluster.map(jobs, "score", lambda job: (prompts[job[0]]["prompt"], config.chat, job[1]), scored)
    apply_scores(runs, scores, label, reference)


def run_cluster_bench(cluster, prompts, methods, config: DecodeConfig | None = None, repeats: int = 3,
                      warmup: int = 1, fidelity: bool = True, json_path=None, progress=None, skipped=None) -> dict:
    """run_bench's measurement on the cluster's workers: the same runs, groups and rotation, each group on one
    worker; `json_path` fills as groups finish and resumes a measurement of the same plan."""
    config, prompts = config or DecodeConfig(), as_prompts(prompts)
    methods = list(dict.fromkeys(methods))
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown methods {unknown}: use some of {', '.join(BENCH_METHODS)}")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    report = progress or (lambda message, fraction: None)
    log = RunLog(json_path, _plan("bench", cluster, config, prompts, methods, repeats, warmup), "method")
    _measure(cluster, log, {"kind": "bench", "config": config, "prompts": prompts, "labels": methods,
                            "warmup": warmup}, report, None)
    if fidelity:
        _score(cluster, log.runs, prompts, config, "method", "ar" if "ar" in methods else None, report)
    result = bench_result(log.meta["machine"], log.meta["models"], config, methods, skipped or {}, repeats, warmup,
                          prompts, sorted(log.runs, key=lambda r: r["order"]))
    result["cluster"] = cluster.summary()
    return log.finish(result)


def run_cluster_sweep(cluster, prompts, config: DecodeConfig | None = None, accept=(0.5, 0.7, 0.9),
                      escalate=(0.0, 0.2, 0.4), signals=("slim", "draft"), routes=None, repeats: int = 1,
                      warmup: int = 1, json_path=None, progress=None, stop=None) -> dict:
    """run_sweep's measurement on the cluster's workers (each prompt and repeat's plain SD and grid points on one
    worker, rotated as locally); `json_path` fills as groups finish and resumes a sweep of the same plan."""
    config, prompts = config or DecodeConfig(), as_prompts(prompts)
    report = progress or (lambda message, fraction: None)
    settings = _settings(routes, signals, accept, escalate)
    plan = _plan("sweep", cluster, config, prompts, sweep_labels(settings), repeats, warmup,
                 settings=[list(s) for s in settings])
    log = RunLog(json_path, plan, "label")
    if "points" not in log.meta:  # each point's route as the pair resolves it (one worker asked)
        log.meta["points"] = cluster.ask("point_meta", settings)
    job = {"kind": "sweep", "config": config, "prompts": prompts, "labels": plan["labels"], "settings": settings,
           "warmup": warmup}
    stopped = _measure(cluster, log, job, report, stop)
    runs = sorted(log.runs, key=lambda r: r["order"])
    if "sd" not in {r["label"] for r in runs}:  # stopped before the baseline ran: nothing to compare with
        return {"schema": "via-sd-bench/1", "kind": "sweep", "stopped": True, "sd": None, "points": [],
                "frontier": [], "best": None, "runs": runs}
    _score(cluster, runs, prompts, config, "label", "sd", report)
    result = sweep_result(log.meta["machine"], log.meta["models"], config, prompts, log.meta["points"], runs,
                          repeats, warmup, stopped)
    result["cluster"] = cluster.summary()
    return log.finish(result)
