"""How soon a Space is useful: `python app.py` started as a Space starts it, a browser pressing Run at once.

Each start: the app in a subprocess (the default embedded preset, the hub off), a headless Chromium that opens the
page as soon as it answers (domcontentloaded, then the Run button), types a prompt and presses Run; times from the
process's start: the page served, Run pressed, the run's first decided token (its first live chip a tier decided,
not the recorded run the page opens on) and the run's end; then what the "Why this speed" panel predicted for that
first run against what it measured. A cold start uses an empty cache (a fresh folder as VIA_SD_CACHE: unpacking,
the kernel's build unless it was built ahead of time, the models' build); the warm restart that follows starts
again on the cache the cold one left; `--evict` adds a restart whose cache files were first dropped from the page
cache (a new container on a persistent disk reads them from the disk again).

The app's log lines are kept with their time since the start (`WORK/NAME.log`: when each load step began), and the
machine's load average is sampled throughout (other work slows every step).

Run:  flock /tmp/via-sd-heavy.lock env PYTHONPATH=. .venv/bin/python scripts/space_start.py [--evict]
      [--warm-only --cache DIR]   (restarts on a cache that exists, e.g. ~/.cache/via-sd)
      [--python PATH]             (the app's interpreter: a venv made from requirements.txt)
      [--work DIR]                (where the cold start's cache and the logs go: a fresh folder under DIR)
      [--preset random]           (another preset than the Space's: the tiny random pair checks this script)
      [--prior]                   (each start without the cache's profiles: the first run prices with the shipped one)
      [--shots docs]              (the first start's first second and load line at 1280x800, as docs/spaces.md shows)
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
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
# The "Why this speed" panel's rows: {pair: [predicted, measured]} as the page shows them ("1.15×").
PANEL_JS = """() => Object.fromEntries([...document.querySelectorAll('#cost-model tr[data-pair]')].map(r =>
  [r.dataset.pair, [...r.querySelectorAll('td')].map(td => td.innerText)]))"""


class Load:
    """The 1-minute load average, sampled every 2 s while a start runs: its mean and its highest."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        self._stop.set()
        self._thread.join()
        s = self.samples or [os.getloadavg()[0]]
        return f"load mean {sum(s) / len(s):.1f}, max {max(s):.1f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keep_log(stream, log: Path, t0: float) -> None:
    """The app's output, each line behind its seconds since the start."""
    with open(log, "w") as out:
        for line in iter(stream.readline, b""):
            out.write(f"{time.perf_counter() - t0:7.1f} s  {line.decode(errors='replace')}")
            out.flush()


def start(python: str, cache: Path, log: Path, preset: str | None) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    env = {**os.environ, "VIA_SD_CACHE": str(cache), "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    env.pop("VIA_SD_PRESET", None)  # the Space's default preset, unless one is named
    env.update({"VIA_SD_PRESET": preset} if preset else {})
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threading.Thread(target=keep_log, args=(proc.stdout, log, t0), daemon=True).start()
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


def one_start(browser, python: str, cache: Path, log: Path, tokens: int, preset: str | None = None,
              shots: Path | None = None) -> dict:
    """Seconds from the process's start to: page, run (pressed), first (decided token), done; and the cost panel's
    rows after that run (panel)."""
    proc, url, t0 = start(python, cache, log, preset)
    at = {}
    try:
        served(proc, url, t0 + 600)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(900_000)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#run")
        at["page"] = time.perf_counter() - t0
        if shots is not None:  # the page as a visitor first sees it, and its load line (docs/spaces.md)
            page.wait_for_selector("#via-tokens .via-tok")
            page.screenshot(path=str(shots / "first-second.png"))
            page.locator("#device").screenshot(path=str(shots / "loading-line.png"))
        box = page.locator("#max-new-tokens input[type=number]")
        box.fill(str(tokens))
        box.press("Enter")
        page.locator("#prompt textarea").fill(PROMPT)
        page.evaluate(RECORD_JS)
        page.wait_for_selector('#cost-model .via-costs[data-state="ready"]')  # the recorded run's panel, drawn
        before = page.evaluate(PANEL_JS)
        page.locator("#run").click()
        at["run"] = time.perf_counter() - t0
        page.wait_for_function("window.__chips.includes('decided')", polling=20)
        at["first"] = time.perf_counter() - t0
        page.wait_for_selector('#status [data-kind="ok"]')
        at["done"] = time.perf_counter() - t0
        # this run's panel: its rows differ from the recorded run's (Gradio's progress overlay changes the text too)
        page.wait_for_function(f"b => JSON.stringify(({PANEL_JS})()) !== JSON.stringify(b)", arg=before,
                               timeout=120_000)
        at["panel"] = page.evaluate(PANEL_JS)
        text = page.locator("#cost-model").inner_text()
        at["profile"] = text.split("priced by the cost profile (")[-1].split("); measured")[0]
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return at


def evict(folder: Path) -> None:
    """Drops every file under `folder` from the page cache (as a new container finds a persistent disk)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--cache", type=Path, help="the cache a warm-only restart starts on")
    parser.add_argument("--evict", action="store_true", help="a restart more, its cache out of the page cache")
    parser.add_argument("--work", type=Path, default=None, help="the folder the cold cache and logs go under")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--shots", type=Path, help="where the first start's screenshots go (first second, load line)")
    parser.add_argument("--prior", action="store_true", help="every start without the profiles a run left (its "
                        "first run then prices with the shipped prior, as on a new machine)")
    parser.add_argument("--keep", action="store_true", help="keep the cold start's cache (it is deleted otherwise)")
    parser.add_argument("--preset", help="another preset than the Space's default (random: a check of this script)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="via-sd-space-", dir=args.work))
    cache = args.cache if args.warm_only else work / "cache"
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; app logs in {work}", flush=True)
    starts = ["warm restart"] if args.warm_only else ["cold start", "warm restart"]
    starts += ["evicted restart"] if args.evict else []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            for name in starts:
                if name == "evicted restart":
                    evict(cache)
                if args.prior:
                    shutil.rmtree(cache / "profiles", ignore_errors=True)
                load = Load()
                at = one_start(browser, args.python, cache, work / f"{name.replace(' ', '-')}.log", args.tokens,
                               args.preset, args.shots if name == starts[0] else None)
                print(f"{name:15s} page {at['page']:6.1f} s · Run {at['run']:6.1f} s · first decided token "
                      f"{at['first']:6.1f} s · run done {at['done']:6.1f} s ({load.stop()})", flush=True)
                rows = " · ".join(f"{k} predicted {v[0]} measured {v[1]}" for k, v in at["panel"].items())
                print(f"{'':15s} first run: {rows}; priced with {at['profile']}", flush=True)
        finally:
            browser.close()
    if not args.warm_only and not args.keep:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
