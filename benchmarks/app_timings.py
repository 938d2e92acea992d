"""Measure the app's responsiveness targets in headless Chromium.

    .venv/bin/python -m benchmarks.app_timings                     # embedded pair
    .venv/bin/python -m benchmarks.app_timings --preset random     # mechanics only

Targets (embedded pair cached on this machine, a ~40-token prompt, two runs in a row):
    page usable          within 30 s of `python app.py`    (Run button on a loaded page)
    first pending draft  within 1 s of clicking Run         (the round's drafts on screen, not yet decided)
    first decided token  within 2 s of clicking Run         (a draft in its tier color; the pair was loaded
                                                             in the background before the click)
    both for the first run and for a second one whose Run is clicked the moment the first says Done
    (back to back: nothing the finished run still computes, figures or fidelity, may delay it)
    what-if update       under 200 ms after a slider move   (keydown on the accept slider -> new estimate)
    memory               peak RSS of `python app.py` <= 3 GB after one comparison (VmHWM of the server)
The run times are taken in the page (performance.now() from the pointer-down on Run to the first
matching element, by a MutationObserver). Also reported: when the background load finished, the
first recorded token (the round's end), the run's own numbers and the peak RSS of the `python app.py`
process once the pair is loaded and after that comparison. Writes artifacts/app_timings.json
and screenshots artifacts/screenshots/timings-*.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import ROOT, run_main, vm  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "browser"))
from test_app_browser import CHROMIUM, free_port  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

PROMPT = ("Write a Python function `is_palindrome(s)` that returns True if the string is a palindrome, ignoring "
          "case, spaces and punctuation, and give it a short docstring with two examples of its use.")  # ~40 tokens
TARGETS = {"page_usable_s": 30.0, "first_pending_s": 1.0, "first_decided_s": 2.0, "again_pending_s": 1.0,
           "again_decided_s": 2.0, "what_if_ms": 200.0, "app_peak_rss_gb": 3.0}

# Times, in the page, from the pointer-down on Run to the first pending draft, first decided draft and
# first recorded token of the VIA-SD pane.
RUN_WATCH_JS = """() => {
  window.__run = {};
  let t0 = null;
  const pane = document.querySelector('#via-tokens');
  let cleared = false;  // a second run: the pane still shows the first run's tokens until the new run resets it
  document.querySelector('#run').addEventListener('pointerdown', () => { t0 = performance.now(); }, {once: true});
  const marks = {pending: '.via-live[data-state="pending"]', decided: '.via-live[data-state="decided"], .via-tok',
                 token: '.via-tok'};
  const obs = new MutationObserver(() => {
    if (t0 === null) return;
    if (!cleared) { cleared = !pane.querySelector('.via-tok, .via-live'); if (!cleared) return; }
    for (const [key, sel] of Object.entries(marks))
      if (window.__run[key] === undefined && pane.querySelector(sel)) window.__run[key] = (performance.now() - t0) / 1000;
    if (Object.keys(window.__run).length === 3) obs.disconnect();
  });
  obs.observe(pane, {subtree: true, childList: true, attributes: true});
}"""

# Marks the keydown on the accept slider and the moment the what-if card shows the new value.
WATCH_JS = """(expected) => {
  const range = document.querySelector('#accept input[type=range]');
  const root = document.querySelector('#whatif');
  window.__whatifMs = undefined;
  let t0 = null;
  range.addEventListener('keydown', () => { t0 = performance.now(); }, {once: true});
  const obs = new MutationObserver(() => {
    const card = root.querySelector('.via-whatif');
    if (t0 !== null && card && card.dataset.accept === expected) { obs.disconnect(); window.__whatifMs = performance.now() - t0; }
  });
  obs.observe(root, {subtree: true, childList: true, attributes: true, characterData: true});
  setTimeout(() => { obs.disconnect(); if (window.__whatifMs === undefined) window.__whatifMs = -1; }, 10000);
}"""


def timed_run(page, result: dict, name: str) -> None:
    """Clicks Run and records when the first pending draft, decided token and token text appeared
    (`{name}_pending_s`, ...), then waits for the run to say Done or fail."""
    page.evaluate(RUN_WATCH_JS)
    page.locator("#run").click()
    page.wait_for_function("window.__run.token !== undefined")
    marks = page.evaluate("window.__run")
    for mark in ("pending", "decided", "token"):
        result[f"{name}_{mark}_s"] = marks.get(mark)
    page.wait_for_selector('#status [data-kind="ok"], #status [data-kind="error"]', timeout=600_000)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--moves", type=int, default=7, help="slider moves to time")
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "app_timings.json"))
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    shots = ROOT / "artifacts" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "VIA_SD_PRESET": args.preset, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    log_path = ROOT / "artifacts" / "app_timings.log"
    result = {"preset": args.preset, "max_new_tokens": args.max_new_tokens, "targets": TARGETS}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT)
    try:
        while True:  # the server answers
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - started > 120:
                    raise RuntimeError(f"app.py did not start; see {log_path}")
                time.sleep(0.1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(180_000)
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector("#run:not([disabled])")
            page.wait_for_selector("#prompt textarea")
            result["page_usable_s"] = time.perf_counter() - started
            page.wait_for_function("document.querySelector('#device').innerText.includes('slim route')", timeout=900_000)
            result["model_ready_s"] = time.perf_counter() - started
            result["loaded_peak_rss_gb"] = round(vm("VmHWM", proc.pid), 2)  # the load's share of the peak

            page.locator("#prompt textarea").fill(PROMPT)
            tokens = page.locator("#max-new-tokens input[type=number]")
            tokens.fill(str(args.max_new_tokens))
            tokens.press("Enter")
            time.sleep(0.5)
            clicked = time.perf_counter()
            timed_run(page, result, "first")
            result["run_s"] = time.perf_counter() - clicked
            result["app_peak_rss_gb"] = round(vm("VmHWM", proc.pid), 2)  # `python app.py` after one comparison
            result["status"] = page.locator("#status").inner_text().strip()
            # back to back: Run again the moment the first run says Done (its figures and fidelity still due)
            timed_run(page, result, "again")
            result["again_status"] = page.locator("#status").inner_text().strip()
            page.wait_for_selector("#cost-plot .js-plotly-plot")
            page.wait_for_function("document.querySelector('#metrics [data-metric=\"fidelity\"] .via-card-value')"
                                   ".innerText.includes('%')", timeout=600_000)
            result["metrics"] = page.locator("#metrics").inner_text().split("\n")
            page.screenshot(path=str(shots / f"timings-{args.preset}-run.png"), full_page=True)
            page.locator("#race-speed label", has_text="4×").click()
            page.locator("#race-replay").click()
            page.wait_for_selector('#race-view .via-race[data-state="done"]')
            result["race"] = page.locator("#race-view .via-race-clock").inner_text().strip()
            page.locator("#race-view").screenshot(path=str(shots / f"timings-{args.preset}-race.png"))

            page.get_by_role("tab", name="Threshold lab").click()
            page.wait_for_selector('#whatif .via-whatif[data-state="estimate"]')
            range_input = page.locator("#accept input[type=range]")
            times = []
            for k in range(args.moves):
                value = float(range_input.input_value())
                step = 0.01 if value < 0.9 else -0.01
                expected = f"{round(value + step, 2):.2f}"
                page.evaluate(WATCH_JS, expected)
                range_input.focus()
                page.keyboard.press("ArrowRight" if step > 0 else "ArrowLeft")
                page.wait_for_function("window.__whatifMs !== undefined")
                times.append(page.evaluate("window.__whatifMs"))
                time.sleep(0.3)
            result["what_if_ms_each"] = [round(t, 1) for t in times]
            valid = [t for t in times if t >= 0]
            result["what_if_ms"] = statistics.median(valid) if valid else None
            result["what_if_ms_max"] = max(valid) if valid else None
            page.screenshot(path=str(shots / f"timings-{args.preset}-lab.png"), full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result["met"] = {k: result.get(k) is not None and result[k] <= v for k, v in TARGETS.items()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for key in ("page_usable_s", "model_ready_s", "first_pending_s", "first_decided_s", "first_token_s", "run_s",
                "again_pending_s", "again_decided_s", "again_token_s", "loaded_peak_rss_gb", "app_peak_rss_gb",
                "what_if_ms", "what_if_ms_max"):
        value = result.get(key)
        target = TARGETS.get(key)
        print(f"{key:16s} {value:8.2f}" + (f"   target <= {target:g}: {'met' if result['met'][key] else 'MISSED'}"
                                            if target else "") if value is not None else f"{key:16s} -")
    print(result["status"])
    return 0 if all(result["met"].values()) else 1


if __name__ == "__main__":
    run_main(main)
