"""One worker of a cluster bench: a pair loaded once that runs many groups of paired runs and scores outputs.
Plain Python (cluster.py makes it a Ray actor; InProcess runs one here); every run is the local bench's `run_once`."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import torch

from ..core.pair import load_pair
from .fidelity import score_output
from ..weights.machine import cpu_name
from .run import machine_info, run_once, warm_up
from .sweep import _point_meta, run_label, warm_up_sweep


def _rss_mb() -> float:
    """This process's resident memory now (MiB; Linux), else its peak so far."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PairWorker:
    """Loads the pair `spec` names (load_pair's arguments) once; then runs groups, scores outputs, describes itself.

    `memory_mb`: what loading the pair took, measured (the peak resident memory it added on CPU, the allocator's
    peak on CUDA): the scheduler places as many workers on a node as its memory holds."""

    def __init__(self, spec: dict, name: str, threads: int | None = None):
        from ..route_search.resolve import pick_route

        if threads:
            torch.set_num_threads(threads)
        before = _rss_mb()
        self.pair = load_pair(**spec)
        pick_route(self.pair)  # the route the command line's pair gets (a shipped or cached one)
        self.name, self.original, self.prepared = name, self.pair.slim, None
        device = self.pair.slim.device
        self.memory_mb = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda"
                          else max(_peak_rss_mb() - before, _rss_mb() - before))
        self.machine = {"host": socket.gethostname(), "cpu": cpu_name(), "kernel": self.pair.kernels(),
                        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}

    def set_threads(self, threads: int) -> int:
        torch.set_num_threads(threads)
        return torch.get_num_threads()

    def info(self) -> dict:
        return {"name": self.name, "memory_mb": self.memory_mb, "machine": self.machine,
                "machine_info": {**machine_info(self.pair), "host": self.machine["host"]},
                "models": self.pair.describe(), "threads": torch.get_num_threads()}

    def point_meta(self, settings: list[tuple]) -> list[dict]:
        """Each sweep point's route as this pair resolves it, and its thresholds."""
        try:
            return _point_meta(self.pair, self.original, settings)
        finally:
            self.pair.slim = self.original

    def run_group(self, job: dict, group: dict) -> list[dict]:
        """Every run of `group` back to back in its order (after the job's warm-up, once per job on this worker):
        the records the local bench makes, with the machine they ran on and this worker's name."""
        prompts, config = job["prompts"], job["config"]
        try:
            if self.prepared != job["id"]:
                for _ in range(job["warmup"]):
                    if job["kind"] == "sweep":
                        warm_up_sweep(self.pair, self.original, prompts[0]["prompt"], config, job["settings"])
                    else:
                        warm_up(self.pair, prompts[0]["prompt"], job["labels"], config)
                self.prepared = job["id"]
            i, runs = group["prompt_index"], []
            for label in group["labels"]:
                if job["kind"] == "sweep":
                    record = run_label(self.pair, self.original, prompts[i]["prompt"], label, config, job["settings"])
                    record["label"] = label
                else:
                    record, _ = run_once(self.pair, prompts[i]["prompt"], label, config)
                record.update(prompt_index=i, task=prompts[i]["task"], repeat=group["repeat"],
                              machine=self.machine, worker=self.name)
                runs.append(record)
            return runs
        finally:
            self.pair.slim = self.original

    def score(self, prompt: str, chat: bool, outputs: list[list[int]]) -> list[dict]:
        """Full-verifier fidelity of each output of one prompt (bench/fidelity.py)."""
        prompt_ids = self.pair.encode(prompt, chat=chat)
        return [score_output(self.pair, prompt_ids, list(ids)) for ids in outputs]


def ask(cluster, method: str, *args):
    """One call on one of the cluster's workers, e.g. `ask(cluster, "point_meta", settings)`."""
    out = []
    cluster.map([args], method, lambda job: job, lambda worker, job, result: out.append(result))
    return out[0]


class InProcess:
    """A cluster of one, without Ray: one PairWorker in this process, its jobs in turn. The local bench with the
    cluster's streamed JSON and resume (`python -m via_sd bench ... --resume`)."""

    def __init__(self, spec: dict):
        self.spec, self.workers, self.lost, self.retried = spec, [], [], 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.workers = []

    def start(self) -> list:
        if not self.workers:
            worker = PairWorker(self.spec, "local")
            self.workers = [SimpleNamespace(handle=worker, name="local", node=socket.gethostname(),
                                            info=worker.info())]
        return self.workers

    def map(self, jobs: list, method: str, args_of, on_result, stop=None) -> bool:
        for job in jobs:
            if stop is not None and stop.is_set():
                return True
            worker = self.start()[0]
            on_result(worker, job, getattr(worker.handle, method)(*args_of(job)))
        return False

    def ask(self, method: str, *args):
        return ask(self, method, *args)

    def summary(self) -> dict:
        w = self.workers[0] if self.workers else None
        return {"where": "this process", "workers": {w.name: {"node": w.node, "threads": w.info["threads"],
                                                              "pair_memory_mb": w.info["memory_mb"],
                                                              "machine": w.info["machine"]}} if w else {},
                "lost_workers": [], "jobs_run_again": 0}
