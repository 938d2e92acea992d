"""assets/talk.png: the race replay of a real run on the embedded pair, as a talk shows it.

Starts `python app.py` (embedded pair), runs one prompt with a threshold preset, replays the three
methods as a race at 4x and saves the finished race view.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python scripts/talk_image.py [--preset fastest] [--tokens 48] [--out assets/talk.png]
"""
import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
parser = argparse.ArgumentParser()
parser.add_argument("--preset", default="fastest", help="threshold preset: paper, fastest or lossless")
parser.add_argument("--tokens", type=int, default=48)
parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
parser.add_argument("--out", default=str(ROOT / "assets" / "talk.png"))
args = parser.parse_args()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
url = f"http://127.0.0.1:{port}/"
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(600_000)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#run")
        page.locator("#threshold-preset label", has_text=args.preset).click()
        page.locator("#prompt textarea").fill(args.prompt)
        box = page.locator("#max-new-tokens input[type=number]")
        box.fill(str(args.tokens))
        box.press("Enter")
        page.locator("#run").click()
        page.wait_for_selector("#ar-tokens .via-tok")
        page.wait_for_selector('#status [data-kind="ok"]')
        page.locator("#race-speed label", has_text="4×").click()
        page.locator("#race-replay").click()
        page.wait_for_selector('#race-view .via-race[data-state="done"]')
        page.locator("#race-view").screenshot(path=args.out)
        print(page.locator("#race-view").inner_text()[:400])
        browser.close()
finally:
    app.terminate()
    app.wait(timeout=30)
print(f"wrote {args.out}")
