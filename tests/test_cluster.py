"""The bench and the sweep on a local two-worker Ray cluster (random pair): the local bench's runs and outputs, each
paired group on one worker, a killed worker's jobs run again elsewhere, a rerun on the same JSON runs nothing; the
flag without Ray says how to install it; the local path never imports Ray. One cluster for the whole file (Ray
starts slowly); the killing test comes last, since it leaves one worker."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from via_sd import DecodeConfig, Thresholds, load_pair
from via_sd.bench import run_bench, run_sweep
from via_sd.bench.cluster import workers_per_node
from via_sd.bench.jobs import RunLog

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"task": "code", "prompt": "def f(x):"}, {"task": "prose", "prompt": "The quick brown fox"},
           {"task": "code", "prompt": "for i in range(10):"}]
CFG = DecodeConfig(gamma=4, max_new_tokens=16, chat=False, thresholds=Thresholds(accept=0.8, escalate=0.3,
                                                                                 signal="draft"))
METHODS = ["ar", "sd", "via"]
GRID = {"accept": [0.5, 0.9], "escalate": [0.0, 0.3], "signals": ["draft"]}


def key(r, label="method"):
    return r[label], r["prompt_index"], r["repeat"]


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from via_sd.bench.cluster import Cluster, connect

    address = os.environ.pop("RAY_ADDRESS", None)  # never a cluster outside the test
    connect("auto", num_cpus=2)
    c = Cluster({"preset": "random"})
    yield c
    c.close()
    ray.shutdown()
    if address:
        os.environ["RAY_ADDRESS"] = address


@pytest.fixture(scope="module")
def pair():
    return load_pair("random")


def check_groups(runs, label="method"):
    """Each (prompt, repeat) group ran on one worker and one machine, back to back; returns the workers used."""
    groups = {}
    for r in runs:
        groups.setdefault((r["prompt_index"], r["repeat"]), []).append(r)
    for group in groups.values():
        assert len({r["worker"] for r in group}) == 1 and len({json.dumps(r["machine"]) for r in group}) == 1
        orders = sorted(r["order"] for r in group)
        assert orders == list(range(orders[0], orders[0] + len(group)))
    return {r["worker"] for r in runs}


def test_the_bench_on_the_cluster_gives_the_local_runs_and_outputs(cluster, pair, tmp_path):
    from via_sd.bench.spread import run_cluster_bench

    local = run_bench(pair, PROMPTS, METHODS, CFG, repeats=2)
    result = run_cluster_bench(cluster, PROMPTS, METHODS, CFG, repeats=2, json_path=tmp_path / "b.json")
    assert {key(r): r["token_ids"] for r in result["runs"]} == {key(r): r["token_ids"] for r in local["runs"]}
    assert len(result["runs"]) == len(local["runs"]) == 3 * len(PROMPTS) * 2
    assert check_groups(result["runs"]) == {"w0", "w1"}
    for r in local["runs"]:  # the same rotated order within each group as the local bench
        twin = next(c for c in result["runs"] if key(c) == key(r))
        first = min((c for c in result["runs"] if c["prompt_index"] == r["prompt_index"] and c["repeat"] ==
                     r["repeat"]), key=lambda c: c["order"])
        assert twin["order"] - first["order"] == r["order"] % 3
    s = result["summary"]["via"]["all"]
    assert s["identical_to_ar"] is not None and s["speedup_vs_sd"] is not None
    assert json.loads((tmp_path / "b.json").read_text())["runs"] == json.loads(json.dumps(result["runs"]))


def test_the_sweep_on_the_cluster_gives_the_local_runs_and_outputs(cluster, pair):
    from via_sd.bench.spread import run_cluster_sweep

    local = run_sweep(pair, PROMPTS, CFG, **GRID, repeats=2)
    result = run_cluster_sweep(cluster, PROMPTS, CFG, **GRID, repeats=2)
    as_label = lambda runs: {key(r, "label"): r["token_ids"] for r in runs}  # noqa: E731
    assert as_label(result["runs"]) == as_label(local["runs"]) and len(result["runs"]) == len(local["runs"])
    check_groups(result["runs"])
    assert [(p["accept"], p["escalate"], p["fidelity"]) for p in result["points"]] == \
        [(p["accept"], p["escalate"], p["fidelity"]) for p in local["points"]]


def test_resume_without_a_cluster_streams_and_skips_what_the_json_holds(pair, tmp_path):
    from via_sd.bench.spread import run_cluster_bench
    from via_sd.bench.worker import InProcess

    path, local = tmp_path / "b.json", run_bench(pair, PROMPTS[:2], METHODS, CFG, repeats=1)
    first = run_cluster_bench(InProcess({"preset": "random"}), PROMPTS[:2], METHODS, CFG, repeats=1, json_path=path)
    assert {key(r): r["token_ids"] for r in first["runs"]} == {key(r): r["token_ids"] for r in local["runs"]}
    assert [r["method"] for r in first["runs"]] == [r["method"] for r in local["runs"]]  # the same order
    said, workers = [], InProcess({"preset": "random"})
    again = run_cluster_bench(workers, PROMPTS[:2], METHODS, CFG, repeats=1, json_path=path,
                              progress=lambda message, fraction: said.append(message))
    assert any("nothing to run" in m for m in said) and workers.workers == []  # not even the pair loaded
    assert again["runs"] == json.loads(json.dumps(first["runs"]))


def test_a_ratio_never_divides_speeds_from_two_machines():
    from via_sd.bench.metrics import paired_ratios

    runs = [{"method": m, "prompt_index": 0, "repeat": 0, "tokens_per_s": v, "machine": {"host": h}}
            for m, v, h in [("sd", 10.0, "a"), ("via", 12.0, "b")]]
    assert paired_ratios(runs, "via", "sd") == []
    runs[1]["machine"] = {"host": "a"}
    assert [p["ratio"] for p in paired_ratios(runs, "via", "sd")] == [pytest.approx(1.2)]


def test_workers_per_node_follow_cpus_memory_and_gpus():
    assert workers_per_node({"CPU": 8, "memory": 10 * 2**30}, pair_mb=3 * 1024) == (3, 2)  # memory holds 3
    assert workers_per_node({"CPU": 2, "memory": 16 * 2**30}, pair_mb=20) == (2, 1)  # one per CPU
    assert workers_per_node({"CPU": 16, "GPU": 2, "memory": 64 * 2**30}, pair_mb=3000) == (2, 8)  # one per GPU
    assert workers_per_node({"CPU": 4, "memory": 2**30}, pair_mb=3000) == (0, 0)  # does not fit


def test_a_json_of_another_measurement_is_refused_naming_what_differs(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"plan": {"kind": "bench", "repeats": 2, "labels": ["ar"]}, "runs": []}))
    with pytest.raises(ValueError, match=r"its repeats differ"):
        RunLog(path, {"kind": "bench", "repeats": 3, "labels": ["ar"]}, "method")


def test_the_flag_without_ray_says_how_to_install_it_and_the_local_path_never_imports_ray(tmp_path):
    code = f"""
import sys
from via_sd.__main__ import main
common = ['bench', '--preset', 'random', '--no-chat', '--max-new-tokens', '8', '--gamma', '2', '--methods', 'ar,sd',
          '--repeats', '1', '--limit', '1']
assert main(common + ['--json', {str(tmp_path / 'local.json')!r}]) == 0
print('RAY LOADED', sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))
sys.modules['ray'] = None  # Ray hidden: as if not installed
print('CODE', main(common + ['--cluster', 'auto']))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "RAY LOADED []" in done.stdout, done.stderr[-2000:]
    assert "CODE 2" in done.stdout
    assert "--cluster needs Ray" in done.stderr and "pip install -r requirements-cluster.txt" in done.stderr
    assert json.loads((tmp_path / "local.json").read_text())["kind"] == "bench"


def test_a_killed_worker_loses_nothing_and_a_rerun_runs_nothing_twice(cluster, tmp_path):
    import ray

    from via_sd.bench.spread import run_cluster_sweep

    path, killed = tmp_path / "sweep.json", []

    def kill_a_worker(message, fraction):
        if "runs," in message and not killed:  # the first finished group: kill the other worker mid-sweep
            ray.kill(cluster.workers[1].handle)
            killed.append(message)

    result = run_cluster_sweep(cluster, PROMPTS, CFG, **GRID, repeats=2, json_path=path, progress=kill_a_worker)
    labels = 1 + len(result["points"])
    assert killed and cluster.lost == ["w1"] and result["cluster"]["lost_workers"] == ["w1"]
    assert result["cluster"]["jobs_run_again"] >= 1
    keys = [key(r, "label") for r in result["runs"]]
    assert len(keys) == len(set(keys)) == labels * len(PROMPTS) * 2  # every run once
    assert [key(r, "label") for r in json.loads(path.read_text())["runs"]] == keys
    check_groups(result["runs"], "label")
    said = []
    again = run_cluster_sweep(cluster, PROMPTS, CFG, **GRID, repeats=2, json_path=path,
                              progress=lambda message, fraction: said.append(message))
    assert any("nothing to run" in m for m in said)
    assert again["runs"] == json.loads(json.dumps(result["runs"]))  # the same runs, timings and all: none again
