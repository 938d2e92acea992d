"""Shared fixtures: tiny random models for mechanics, the embedded real pair for integration."""

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
if "GRADIO_TEMP_DIR" not in os.environ:
    # Gradio's file cache for this session (before gradio is imported: some of its modules read it once): the
    # servers tests run keep the files they serve there, removed with the session. In /tmp/gradio they outlived
    # it, ~10 MB a suite (the app's own hourly clean-up reaches only a running process's files).
    _gradio_temp = tempfile.mkdtemp(prefix="via-sd-gradio-")
    atexit.register(shutil.rmtree, _gradio_temp, ignore_errors=True)
    os.environ["GRADIO_TEMP_DIR"] = _gradio_temp


def _session_cache() -> Path:
    """A cache for this test session holding only what the set-up made (`python -m via_sd setup`: the embedded pair,
    the compiled kernel and the built int4 models, linked, and the cost profile it measured, copied), never what an earlier test run measured or searched: so a
    session on a machine that ran the tests before behaves as on a fresh one."""
    from via_sd.cli.setup import SETUP_RECORD
    from via_sd.weights.paths import cache_root

    built, session = cache_root(), Path(tempfile.mkdtemp(prefix="via-sd-tests-"))
    atexit.register(shutil.rmtree, session, ignore_errors=True)
    for made in ("embedded", "kernels", "built"):  # the pair, the compiled low-bit kernel, the pair's built int4 models
        if (built / made).is_dir():
            (session / made).symlink_to(built / made, target_is_directory=True)
    try:
        profiles = json.loads((built / SETUP_RECORD).read_text())["profiles"]
    except (OSError, ValueError, KeyError):
        profiles = []  # no set-up record: embedded tests measure the profile themselves
    for name in profiles:
        if (built / "profiles" / name).is_file():
            (session / "profiles").mkdir(exist_ok=True)
            shutil.copy(built / "profiles" / name, session / "profiles" / name)
    return session


os.environ["VIA_SD_CACHE"] = str(_session_cache())
# The suite runs two workers on two cores, and a test on the real pair keeps both threads: OpenMP's threads spin while
# they wait for work, so two such processes at once spun against each other (`python -m via_sd setup`, 10 s alone,
# took 98 s beside another worker's 300-token runs). Waiting threads sleep instead (read when torch loads OpenMP: set
# here, before it; child processes inherit it). Bits do not depend on threads, and no test times a run.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from via_sd import load_pair, tiny_random_pair  # noqa: E402

THREADS = torch.get_num_threads()


def pytest_runtest_setup(item):
    """Tiny models run on one thread: on a busy two-core machine two threads spin against each other (a tiny
    int4 step: 155 ms on two, 1.8 ms on one). Tests on the real pair, and the app they drive, keep them all
    (the pair's cost profile is measured with them). Set before any fixture of the test is built."""
    real = item.get_closest_marker("embedded") or item.get_closest_marker("browser")
    torch.set_num_threads(THREADS if real else 1)


@pytest.fixture(scope="session")
def tiny_pair():
    """A 2-layer drafter and 4-layer verifier (random weights, character tokenizer), no route."""
    return tiny_random_pair(seed=0)


@pytest.fixture(scope="session")
def tiny_routed_pair():
    """The same tiny pair with a slim verifier that skips two sub-layers."""
    return tiny_random_pair(seed=0, route=["attn.1", "mlp.2"])


@pytest.fixture(scope="session")
def embedded_pair():
    """The real Qwen2.5-Coder 0.5B -> 1.5B pair from the PyPI wheels (built into a cache on first use)."""
    return load_pair("embedded")


@pytest.fixture(scope="module")
def serve_random_app():
    """Serves the page on the random pair on a free localhost port, queued as `python app.py` queues it, until the
    module ends: `serve(**launch_options)` returns its URL."""
    import socket

    import app

    demos = []

    def serve(**launch) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        demo = app.build_demo("random")
        demo.queue(default_concurrency_limit=1, max_size=64)
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch)
        demos.append(demo)
        return f"http://127.0.0.1:{port}/"

    yield serve
    for demo in demos:
        demo.close()


CHROMIUM = "/usr/bin/chromium"  # Debian's (scripts/setup.sh --dev installs it); never `playwright install`


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium for every browser test of the session (two sync Playwrights in one thread clash)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()
