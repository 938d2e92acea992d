"""Every measurement in benchmarks/ runs, on the tiny random pair with small sizes, through the one harness: its
prompt loader, its paired-and-rotated runs and its lock. (benchmarks.lookup_ceiling and drafter_ceiling run in
test_drafters.py.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ab, code_path_cost, cost_targets, first_token, harness, memory, profile_replay, weights_passes

ROOT = Path(__file__).resolve().parent.parent
RUN_HERE = {"ab", "app_timings", "code_path_cost", "cost_targets", "first_token", "memory", "profile_replay",
            "weights_passes"}
RUN_ELSEWHERE = {"lookup_ceiling": "tests/test_drafters.py", "drafter_ceiling": "tests/test_drafters.py",
                 "kernel_fidelity": "tests/test_weights.py"}


def test_every_benchmark_is_run_by_a_test_and_none_edits_sys_path():
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "harness"}
    assert names == RUN_HERE | set(RUN_ELSEWHERE)
    for name, where in RUN_ELSEWHERE.items():
        assert f"benchmarks import {name}" in (ROOT / where).read_text()
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        assert "sys.path.insert(0, str(ROOT))" not in text and "/tmp/viasd" not in text, path.name
        if path.stem in names:
            assert "run_main(main)" in text, f"{path.name} does not run under the harness's lock"


def test_paired_runs_rotate_the_order_and_ratios_pair_items():
    order = []

    def run(item, name, setting):
        order.append((item["i"], name))
        return {"tokens_per_s": setting * item["speed"]}

    items = [{"i": 0, "speed": 1.0}, {"i": 1, "speed": 3.0}, {"i": 2, "speed": 10.0}]
    rows = harness.paired(items, {"a": 2.0, "b": 1.0, "c": 4.0}, run)
    assert [n for i, n in order if i == 0] == ["a", "b", "c"] and [n for i, n in order if i == 1] == ["b", "c", "a"]
    assert harness.paired_ratio(rows, "a", "b") == 2.0 and harness.paired_ratio(rows, "c", "a") == 2.0


def test_the_harness_takes_the_lock_unless_a_process_above_holds_it(tmp_path, monkeypatch):
    lock = tmp_path / "heavy.lock"
    monkeypatch.setattr(harness, "LOCK", lock)
    with harness.heavy():  # nobody holds it: taken here
        assert harness._held_above()
    code = ("import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks import harness; "
            f"harness.LOCK = Path({str(lock)!r}); print(harness._held_above())")
    held = subprocess.run(["flock", str(lock), sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert held.stdout.strip() == "True"  # under `flock LOCK python -m benchmarks.x` it does not wait for itself


def test_ab_compares_any_config_field_paired_and_says_which_field_is_wrong(capsys):
    assert ab.main(["progressive=true,false", "--preset", "random", "--methods", "via:paper,sd", "--limit", "2",
                    "--tokens", "8", "--set", "gamma=3"]) == 0
    out = capsys.readouterr().out
    assert "| via:paper progressive=True |" in out and "| sd progressive=False |" in out and "| 2/2 |" in out
    assert ab.main(["slim_cache=own,full", "--preset", "random", "--methods", "via:fastest", "--limit", "1",
                    "--tokens", "6", "--agreement"]) == 0
    assert "agreement |" in capsys.readouterr().out
    for bad, words in ((["progresive=true,false"], "unknown DecodeConfig field 'progresive'"),
                       (["progressive=yes,no"], "progressive takes"), (["progressive=true"], "at least two values")):
        with pytest.raises(SystemExit, match=words):
            ab.main([*bad, "--preset", "random"])


def test_cost_targets_reports_every_setting_and_records_the_presets(capsys, tmp_path):
    record = tmp_path / "presets.json"
    assert cost_targets.main(["--preset", "random", "--limit", "1", "--tokens", "6", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert all(f"| {name} |" in out for name in ("ar", "sd", "paper", "fastest")) and "paper matches plain SD" in out
    assert set(json.loads(record.read_text())["presets"]) == {"paper", "fastest"}


def test_first_token_times_every_method(capsys):
    assert first_token.main(["--preset", "random", "--repeats", "1", "--tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name:12s} first decided token" in out for name in first_token.SETTINGS)


def test_memory_reports_load_and_peak_for_the_engine_and_the_app(capsys):
    assert memory.main(["--preset", "random", "--tokens", "6"]) == 0
    engine = json.loads(capsys.readouterr().out)
    assert engine["via_tokens"] == engine["sd_tokens"] == 6 and engine["peak_rss_gb"] > 0
    assert memory.main(["--preset", "random", "--tokens", "6", "--app"]) == 0
    assert set(json.loads(capsys.readouterr().out)["traces"]) == {"ar", "sd", "via"}


def test_weights_passes_measures_passes_agreement_and_prompt_reads(capsys, tmp_path):
    assert weights_passes.main(["--preset", "random", "--weights", "fp32", "--limit", "1", "--tokens", "4",
                                "--repeat", "1", "--reference", str(tmp_path / "ref.json")]) == 0
    assert "| fp32 |" in capsys.readouterr().out
    assert weights_passes.main(["--preset", "random", "--weights", "fp32", "--prompt-reads", "8"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["prompt"], r["model"]) for r in rows] == [(8, "verifier"), (8, "drafter")]


def test_code_path_cost_runs_each_aten_path_in_a_child(capsys):
    assert code_path_cost.main(["--preset", "random", "--rounds", "1", "--steps", "2", "--context", "16"]) == 0
    out = capsys.readouterr().out
    assert "verifier step" in out and "ATen paths: pinned" in out


@pytest.mark.browser
def test_app_timings_measures_the_page_on_the_random_pair(tmp_path):
    # a process of its own, as a user runs it: Playwright's sync API refuses a thread where an asyncio loop runs,
    # and earlier tests in this process (the MCP and app clients) may leave one
    # its exit status says whether the targets were met: a timing, which the other worker's load moves, so what is
    # checked here is that every figure was measured and the status follows them
    out = tmp_path / "timings.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.app_timings", "--preset", "random", "--max-new-tokens",
                           "8", "--moves", "2", "--out", str(out)], cwd=ROOT, timeout=600)
    result = json.loads(out.read_text())
    measured = ("page_usable_s", "model_ready_s", "first_pending_s", "first_decided_s", "again_decided_s",
                "app_peak_rss_gb", "what_if_ms")
    assert all(isinstance(result.get(k), (int, float)) and result[k] > 0 for k in measured), result
    assert done.returncode == (0 if all(result["met"].values()) else 1), (done.returncode, result["met"])


def test_the_trace_parity_script_finds_equal_runs_equal_and_names_a_changed_field(tmp_path, capsys):
    """scripts/trace_parity.py: what proved the engine's refactors changed no token, trace or event."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trace_parity", ROOT / "scripts" / "trace_parity.py")
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    parity.record(tmp_path / "a", False, limit=3)
    parity.record(tmp_path / "b", False, limit=3)
    assert parity.compare(tmp_path / "a", tmp_path / "b") == 0
    traces = json.loads((tmp_path / "b" / "random.json").read_text())
    traces[1]["rounds"][0]["gamma"] += 1
    traces[2]["wall_ms"] = -1.0  # a timing field: never compared
    (tmp_path / "b" / "random.json").write_text(json.dumps(traces))
    assert parity.compare(tmp_path / "a", tmp_path / "b") == 1
    assert "random.json[1].rounds[0].gamma:" in capsys.readouterr().out


def test_profile_replay_records_comparisons_and_prices_them_kept_and_corrected(tmp_path, capsys):
    runs = tmp_path / "runs.json"
    assert profile_replay.main(["--preset", "random", "--limit", "2", "--tokens", "8", "--record", str(runs)]) == 0
    recorded = json.loads(runs.read_text())
    assert len(recorded) == 2 and all([t["method"] for t in c] == ["via", "sd", "ar"] for c in recorded)
    assert all("ms" in call for c in recorded for t in c for r in t["rounds"] for call in r["calls"])
    capsys.readouterr()
    assert profile_replay.main(["--replay", str(runs), str(runs)]) == 0
    out = capsys.readouterr().out
    assert "4 comparisons; start: " in out
    for name in ("kept", "corrected"):
        assert sum(line.startswith(name) for line in out.splitlines()) == 5, out  # a line a comparison, a summary
        assert re.search(rf"^{name}: worst speed-up error per comparison, median \d+%; tokens/s error, median \d+%$",
                         out, re.M), out
