"""End to end in headless Chromium: `python app.py` on the random preset, driven like a person would.

Opens the page, runs an example, waits for tier-colored tokens in both panes and for the plots,
moves a threshold slider and sees the what-if estimate change, downloads the trace and uploads it
again (and a file that is not a trace), steps through the learn view, then checks dark theme and
presentation mode. Screenshots go to artifacts/screenshots/ (look at them).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 90_000  # the machine is shared: generous, a slow page is not a broken page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM}"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(preset: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py` in a subprocess on a free port; returns (process, url) once the page answers."""
    port = free_port()
    env = {**os.environ, "VIA_SD_PRESET": preset, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise RuntimeError("app.py did not answer within 120 s")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    proc, url = start_app("random", tmp_path_factory.mktemp("app") / "app.log")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, url: str, theme: str = "light"):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url + ("?__theme=dark" if theme == "dark" else ""), wait_until="domcontentloaded")
    page.wait_for_selector("#run")
    return page


def run_and_wait(page) -> None:
    page.locator("#run").click()
    page.wait_for_selector("#via-tokens .via-tok")
    page.wait_for_selector("#sd-tokens .via-tok")
    page.wait_for_selector('#status [data-kind="ok"]')
    page.wait_for_selector("#confidence-plot .js-plotly-plot")


def show_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def test_run_an_example_tune_thresholds_download_and_replay(browser, app_url, tmp_path):
    page = open_page(browser, app_url)
    page.screenshot(path=str(SHOTS / "01-start.png"), full_page=True)

    from playwright.sync_api import expect

    page.get_by_text("code: Write a Python function").first.click()
    expect(page.locator("#prompt textarea")).to_have_value(re.compile("is_palindrome"))
    run_and_wait(page)
    colors = page.eval_on_selector_all(
        "#via-tokens .via-tok, #sd-tokens .via-tok",
        "els => [...new Set(els.map(e => getComputedStyle(e).backgroundColor))]")
    assert len(colors) >= 2, "tokens are colored by tier"
    assert page.locator('#metrics [data-metric="speedup_sd"] .via-card-value').inner_text().endswith("×")
    assert "%" in page.locator('#metrics [data-metric="fidelity"] .via-card-value').inner_text()
    page.screenshot(path=str(SHOTS / "02-run-light.png"), full_page=True)

    show_tab(page, "Latency")
    page.wait_for_selector("#latency-plot .js-plotly-plot")
    page.locator("#latency-plot").screenshot(path=str(SHOTS / "03-latency.png"))
    show_tab(page, "Speed-up")
    page.wait_for_selector("#speedup-plot .js-plotly-plot")
    page.locator("#speedup-plot").screenshot(path=str(SHOTS / "04-speedup.png"))

    show_tab(page, "Threshold lab")
    before = page.locator('#whatif .via-whatif[data-state="estimate"]')
    before.wait_for()
    accept_before = float(before.get_attribute("data-accept"))
    page.locator("#accept input[type=range]").focus()
    for _ in range(15):
        page.keyboard.press("ArrowRight")
    expected = f"{min(accept_before + 0.15, 1.0):.2f}"
    page.wait_for_selector(f'#whatif .via-whatif[data-accept="{expected}"]')
    assert "ESTIMATE" in page.locator("#whatif").inner_text()
    page.screenshot(path=str(SHOTS / "05-threshold-lab.png"), full_page=True)

    show_tab(page, "Trace")
    with page.expect_download() as download:
        page.locator("#trace-download").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == "via-sd-trace-via.json" and '"schema": "via-sd-trace/1"' in saved.read_text()

    bad = tmp_path / "not-a-trace.json"
    bad.write_text('{"hello": "world"}')
    page.locator("#trace-upload input[type=file]").set_input_files(str(bad))
    page.wait_for_selector('#status [data-kind="error"]')
    assert "not a VIA-SD trace" in page.locator("#status").inner_text()
    page.screenshot(path=str(SHOTS / "06-bad-upload.png"), full_page=False)
    page.locator("#trace-upload button[aria-label='Clear']").first.click()

    # a fresh session (no run, no tokens) replays the downloaded trace from the file alone
    fresh = open_page(browser, app_url)
    assert fresh.locator("#via-tokens .via-tok").count() == 0
    show_tab(fresh, "Trace")
    fresh.locator("#trace-upload input[type=file]").set_input_files(str(saved))
    fresh.wait_for_selector('#status [data-kind="ok"]:has-text("Replaying uploaded trace")')
    fresh.wait_for_selector("#via-tokens .via-tok")
    expect(fresh.locator("#trace-table")).to_contain_text("draft", timeout=TIMEOUT_MS)  # the table
    assert fresh.locator("#via-tokens .via-tok").count() == page.locator("#via-tokens .via-tok").count()
    fresh.screenshot(path=str(SHOTS / "07-replay.png"), full_page=True)
    fresh.close()

    show_tab(page, "Learn")
    page.locator("#learn-next").click()
    page.wait_for_selector('#learn-view .via-learn[data-round="1"]')
    assert "round 2 of" in page.locator("#learn-view").inner_text()
    page.locator("#learn-view").screenshot(path=str(SHOTS / "08-learn.png"))
    assert "Traceback" not in page.content()
    page.close()


def test_bad_input_shows_a_message(browser, app_url):
    page = open_page(browser, app_url)
    page.locator("#run").click()  # empty prompt
    page.wait_for_selector('#status [data-kind="error"]')
    assert "prompt is empty" in page.locator("#status").inner_text()
    assert "Traceback" not in page.content()
    page.close()


def test_dark_theme_and_presentation_mode(browser, app_url):
    page = open_page(browser, app_url, theme="dark")
    page.locator("#prompt textarea").fill("Explain speculative decoding in one sentence.")
    run_and_wait(page)
    assert "dark" in page.evaluate("document.body.className")
    bg = page.eval_on_selector("#confidence-plot .main-svg", "e => getComputedStyle(e).backgroundColor")
    assert bg not in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)") or page.eval_on_selector(
        "#confidence-plot .bg", "e => e.style.fill") != "rgb(255, 255, 255)", "figures follow the dark theme"
    page.screenshot(path=str(SHOTS / "09-run-dark.png"), full_page=True)

    size = lambda: page.eval_on_selector("#via-tokens .via-sd-tokens", "e => parseFloat(getComputedStyle(e).fontSize)")
    normal = size()
    page.locator("#presentation input").check()
    page.wait_for_function("document.body.classList.contains('presentation')")
    assert size() >= 1.5 * normal, "presentation mode enlarges the tokens"
    page.screenshot(path=str(SHOTS / "10-presentation-dark.png"), full_page=False)
    page.close()


@pytest.mark.embedded
def test_embedded_pair_streams_real_text(browser, tmp_path):
    """The real Qwen2.5-Coder pair behind the page (run under `flock /tmp/via-sd-heavy.lock`). The app
    runs in its own process, so no other test of this session may hold the embedded pair then (the
    `embedded_pair` fixture is first used in files sorted after this one)."""
    from via_sd.embedded import embedded_ready

    if not embedded_ready():
        pytest.skip("the embedded pair's cache is not built (python -m via_sd setup)")
    proc, url = start_app("embedded", tmp_path / "app.log")
    try:
        page = open_page(browser, url)
        page.wait_for_function("document.querySelector('#device').innerText.includes('float32')", timeout=300_000)
        tokens = page.locator("#max-new-tokens input[type=number]")
        tokens.fill("24")
        tokens.press("Enter")
        page.locator("#prompt textarea").fill("Write a Python function that adds two numbers.")
        page.locator("#run").click()
        page.wait_for_selector("#via-tokens .via-tok", timeout=120_000)
        page.wait_for_selector('#status [data-kind="ok"]', timeout=600_000)
        via_text = page.locator("#via-tokens .via-sd-tokens").inner_text()
        sd_text = page.locator("#sd-tokens .via-sd-tokens").inner_text()
        assert re.search(r"def |add|\+", via_text) and re.search(r"def |add|\+", sd_text), "real text, not gibberish"
        assert "Qwen2.5-Coder" in page.locator("#device").inner_text()
        page.wait_for_selector("#confidence-plot .js-plotly-plot")
        page.screenshot(path=str(SHOTS / "11-embedded-run.png"), full_page=True)
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
