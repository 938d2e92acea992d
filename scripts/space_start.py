"""How soon a Space is useful: `python app.py` started as a Space starts it, a browser pressing Run at once.

Each start: the app in a subprocess (the default embedded preset, the hub off), a headless Chromium that opens the
page as soon as it answers (domcontentloaded, then the Run button), types a prompt and presses Run; times from the
process's start: the page served, Run pressed, the run's first decided token (its first live chip a tier decided,
not the recorded run the page opens on) and the run's end. A cold start uses an empty cache (a fresh folder as
VIA_SD_CACHE: unpacking, the kernel's build unless it was built ahead of time, loading); the warm restart that
follows starts again on the cache the cold one left.

Run:  flock /tmp/via-sd-heavy.lock env PYTHONPATH=. .venv/bin/python scripts/space_start.py
      [--warm-only --cache DIR]   (a restart on a cache that exists, e.g. ~/.cache/via-sd)
      [--python PATH]             (the app's interpreter: a venv made from requirements.txt)
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function that checks whether a string is a palindrome."
# Every live draft chip state the page shows, in order (as the browser tests record them).
RECORD_JS = """() => {
  window.__chips = [];
  new MutationObserver(() => document.querySelectorAll('#via-tokens .via-live').forEach(e =>
      window.__chips.push(e.dataset.state))).observe(document.body, {subtree: true, childList: true, attributes: true});
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(python: str, cache: Path, log: Path) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    env = {**os.environ, "VIA_SD_CACHE": str(cache), "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("VIA_SD_PRESET", None)  # the Space's default preset
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "app.py"], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/", t0


def served(proc, url: str, deadline: float) -> None:
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the page was not served in time")


def one_start(browser, python: str, cache: Path, log: Path, tokens: int) -> dict:
    """Seconds from the process's start to: page, run (pressed), first (decided token), done."""
    proc, url, t0 = start(python, cache, log)
    at = {}
    try:
        served(proc, url, t0 + 600)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(900_000)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#run")
        at["page"] = time.perf_counter() - t0
        box = page.locator("#max-new-tokens input[type=number]")
        box.fill(str(tokens))
        box.press("Enter")
        page.locator("#prompt textarea").fill(PROMPT)
        page.evaluate(RECORD_JS)
        page.locator("#run").click()
        at["run"] = time.perf_counter() - t0
        page.wait_for_function("window.__chips.includes('decided')", polling=20)
        at["first"] = time.perf_counter() - t0
        page.wait_for_selector('#status [data-kind="ok"]')
        at["done"] = time.perf_counter() - t0
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--cache", type=Path, help="the cache a warm-only restart starts on")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="via-sd-space-"))
    cache = args.cache if args.warm_only else work / "cache"
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; app logs in {work}", flush=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            for name in (["warm restart"] if args.warm_only else ["cold start", "warm restart"]):
                at = one_start(browser, args.python, cache, work / f"{name.replace(' ', '-')}.log", args.tokens)
                print(f"{name:13s} page {at['page']:6.1f} s · Run {at['run']:6.1f} s · first decided token "
                      f"{at['first']:6.1f} s · run done {at['done']:6.1f} s (load {os.getloadavg()[0]:.1f})",
                      flush=True)
        finally:
            browser.close()
    if not args.warm_only:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
