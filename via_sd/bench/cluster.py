"""Workers on a Ray cluster: connecting (RAY_ADDRESS, an address, or a local cluster), how many workers each node
holds, and handing jobs to them so that a dead worker's jobs run again elsewhere. Ray is imported here only, and
only once a cluster is asked for (`--cluster`); spread.py runs the bench and the sweep on a `Cluster`.

Each worker is a Ray actor around worker.PairWorker: it loads the pair once and runs many jobs. A CPU node holds as
many as it has CPUs, no more than its memory holds at the pair's measured size (the first worker measures it);
a GPU node holds one per GPU.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from pathlib import Path

from .worker import PairWorker, ask

INSTALL = "pip install -r requirements-cluster.txt"
ROOT = Path(__file__).resolve().parents[2]
PASSED_ON = ("VIA_SD_CACHE", "HF_HUB_OFFLINE", "HF_HOME")  # the driver's settings the workers share
IN_FLIGHT = 2  # groups handed to a worker at once: the next waits in its queue, so it never idles between two
READY_TIMEOUT_S = 900  # the first worker: a big pair loads slowly
MIN_WAIT_S = 60  # the others, at least: three times the first's start, then they are let go


def ray_missing() -> str | None:
    """None when Ray imports, else the message that says how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return f"--cluster needs Ray, which is not installed here: {INSTALL} (then run the command again)"
    return None


def runtime_env() -> dict:
    """Workers import this checkout's via_sd and share the driver's cache settings (docs/cluster.md)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"env_vars": {"PYTHONPATH": path, **{k: os.environ[k] for k in PASSED_ON if k in os.environ}}}


def connect(address: str = "auto", num_cpus: int | None = None) -> str:
    """Joins the cluster at `address` ("auto": RAY_ADDRESS, else a new local one; `num_cpus` sizes a local one).
    A process already connected keeps its cluster. Returns where it is, in words."""
    import ray

    if not ray.is_initialized():
        where = None if address == "auto" else address
        ray.init(address=where, num_cpus=num_cpus if where is None else None, include_dashboard=False,
                 log_to_driver=False, runtime_env=runtime_env(), logging_level="ERROR")
    return os.environ.get("RAY_ADDRESS") if address == "auto" and os.environ.get("RAY_ADDRESS") else \
        (address if address != "auto" else "a local Ray cluster")


def workers_per_node(resources: dict, pair_mb: float) -> tuple[int, int]:
    """(workers, threads each) a node holds: one per GPU; else one per CPU while its memory holds the pair."""
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    if gpus:
        return gpus, max(cpus // gpus, 1)
    memory = resources.get("memory")  # what Ray lets tasks use on the node (bytes), when it says
    fit = int(memory / 2**20 // pair_mb) if memory is not None and pair_mb > 0 else cpus
    n = min(cpus, fit)
    return n, max(cpus // n, 1) if n else 0


class Worker:
    def __init__(self, handle, name: str, node: str):
        self.handle, self.name, self.node = handle, name, node
        self.info: dict = {}


class Cluster:
    """The workers of one pair on the cluster, started on first use (a finished measurement starts none)."""

    def __init__(self, spec: dict, address: str = "auto", max_workers: int | None = None, progress=None,
                 num_cpus: int | None = None):
        self.spec, self.address, self.max_workers, self.num_cpus = spec, address, max_workers, num_cpus
        self.report = progress or (lambda message, fraction: None)
        self.workers: list[Worker] = []
        self.lost: list[str] = []
        self.retried = 0
        self.where = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self) -> list[Worker]:
        """Connects and starts the workers (once): the first measures the pair, then each node gets its share."""
        if self.workers:
            return self.workers
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.where = connect(self.address, self.num_cpus)
        nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: "node:__internal_head__" not in
                       n["Resources"])
        actor = ray.remote(PairWorker)

        def launch(node, k, threads):
            gpu = int(node["Resources"].get("GPU", 0)) > 0
            handle = actor.options(num_cpus=1, num_gpus=1 if gpu else 0, max_restarts=0,
                                   scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                                   ).remote(self.spec, f"w{k}", threads)
            return Worker(handle, f"w{k}", node["NodeManagerAddress"])

        self.report(f"cluster: {self.where}, {len(nodes)} node(s): loading the pair on a first worker", 0.0)
        began = time.monotonic()
        self.workers = self._ready([launch(nodes[0], 0, None)], READY_TIMEOUT_S)
        if not self.workers:
            raise RuntimeError(f"the first cluster worker did not load the pair within {READY_TIMEOUT_S} s (no node "
                               "has room for it, or the load failed there: see above)")
        first, waited = self.workers[0], max(3 * (time.monotonic() - began), MIN_WAIT_S)
        plan = [(node, *workers_per_node(node["Resources"], first.info["memory_mb"])) for node in nodes]
        ray.get(first.handle.set_threads.remote(plan[0][2]))
        more = []
        for node, count, threads in plan:
            for _ in range(count - (node is nodes[0])):
                if self.max_workers is None or 1 + len(more) < self.max_workers:
                    more.append(launch(node, 1 + len(more), threads))
        self.workers += self._ready(more, waited)  # ones that find no room (a busy cluster) are let go
        self.report(f"cluster: {len(self.workers)} worker(s) on {len(nodes)} node(s), the pair takes "
                    f"{first.info['memory_mb']:.0f} MiB each", 0.0)
        return self.workers

    def _ready(self, workers: list[Worker], timeout: float) -> list[Worker]:
        """The workers that loaded their pair within `timeout` s (their `info` set); the others are let go."""
        import ray
        from ray.exceptions import RayActorError

        refs = {w.handle.info.remote(): w for w in workers}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=timeout) if refs else ([], [])
        for ref in ready:
            try:
                refs[ref].info = ray.get(ref)
            except RayActorError as err:
                print(f"cluster: worker {refs[ref].name} could not load the pair: {err}", file=sys.stderr, flush=True)
        for ref in waiting:
            ray.kill(refs[ref].handle)
        if waiting:
            print(f"cluster: {len(waiting)} worker(s) found no room within {timeout:.0f} s: running on the others",
                  file=sys.stderr, flush=True)
        return [w for w in workers if w.info]

    def map(self, jobs: list, method: str, args_of, on_result, stop=None) -> bool:
        """Calls the workers' `method(*args_of(job))` for every job, on the live workers, each result to
        `on_result(worker, job, result)` as it arrives. A job whose worker died runs again on another. Returns
        True when `stop` (anything with is_set()) ended it early."""
        if not jobs:
            return False
        import ray
        from ray.exceptions import RayActorError, WorkerCrashedError

        live = [w for w in self.start() if w.name not in self.lost]
        queue, flight = deque(range(len(jobs))), {}
        while queue or flight:
            if stop is not None and stop.is_set():
                for ref in flight:  # queued groups never start; a running one ends where Ray can stop it
                    ray.cancel(ref)
                return True
            for depth in range(IN_FLIGHT):  # every live worker one job deeper in turn, up to IN_FLIGHT each
                for w in live:
                    if queue and sum(f[0] is w for f in flight.values()) <= depth:
                        k = queue.popleft()
                        flight[getattr(w.handle, method).remote(*args_of(jobs[k]))] = (w, k)
            if not live:
                raise RuntimeError(f"every cluster worker died ({', '.join(self.lost)}); "
                                   f"{len(queue)} job(s) left: run the same command again to resume")
            ready, _ = ray.wait(list(flight), num_returns=1, timeout=1.0)
            for ref in ready:
                w, k = flight.pop(ref)
                try:
                    result = ray.get(ref)
                except (RayActorError, WorkerCrashedError) as err:
                    if w in live:
                        live.remove(w)
                        self.lost.append(w.name)
                        print(f"cluster: worker {w.name} on {w.node} died ({type(err).__name__}); its jobs run "
                              "again elsewhere", file=sys.stderr, flush=True)
                    queue.appendleft(k)
                    self.retried += 1
                    continue
                on_result(w, jobs[k], result)
        return False

    def ask(self, method: str, *args):
        """One call on a worker (the first that answers), e.g. `ask("point_meta", settings)`."""
        return ask(self, method, *args)

    def summary(self) -> dict:
        return {"where": self.where, "workers": {w.name: {"node": w.node, "threads": w.info.get("threads"),
                                                          "pair_memory_mb": w.info.get("memory_mb"),
                                                          "machine": w.info.get("machine")} for w in self.workers},
                "lost_workers": self.lost, "jobs_run_again": self.retried}

    def close(self) -> None:
        if self.workers:
            import ray

            for w in self.workers:
                ray.kill(w.handle)
            self.workers = []
