"""Record the runs the app opens on: VIA-SD, plain SD and AR on the embedded pair, a few short prompts.

The page opens on the first of these before any model has loaded (studio.recorded), so the lanes, the race
replay, the step-through view and the what-if work in the first second. Each prompt gives two files in
assets/recorded/: `NAME.json.gz`, the three traces as a list (gunzipped, the format the app's upload replays; a
few KB), and `NAME.about.json`, where and when they were recorded, how busy the machine was, and their fidelity
(the page labels the run with them). Record on a quiet machine: the timings are what the race replays (it waits up
to 3 minutes for the load average to fall below 1; the page says "busy" with the load it found).

Run:  flock /tmp/via-sd-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/record_runs.py
      [--preset embedded] [--max-new-tokens 48] [--out assets/recorded]
"""
import argparse
import datetime
import gzip
import json
import os
import time
from pathlib import Path

from via_sd import DecodeConfig, load_pair, generate
from via_sd.bench.fidelity import measure_fidelities
from via_sd.weights.machine import cpu_name

PROMPTS = {  # short, so the traces stay a few KB; the first is the one the page opens on
    "palindrome": "Write a Python function that checks whether a string is a palindrome.",
}
METHODS = ("via", "sd", "ar")


def rounded(value, digits: int = 4):
    """Floats to `digits` decimals, everywhere in a trace: the files stay small, nothing drawn changes."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default="assets/recorded")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quiet_by = time.time() + 180  # the 1-minute load average still counts the work just before: let it settle
    while os.getloadavg()[0] >= 1.0 and time.time() < quiet_by:
        time.sleep(5)
    busy = round(os.getloadavg()[0], 1)  # other work on the machine before ours starts: it slows every lane
    pair = load_pair(args.preset)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=0)  # the page's defaults: paper rule, gamma auto
    for method in METHODS:  # warm: first-call costs stay out of the times
        generate(pair, "Hello", method, DecodeConfig(max_new_tokens=4))
    for name, prompt in PROMPTS.items():
        traces = {m: generate(pair, prompt, m, config) for m in METHODS}
        fidelity = measure_fidelities(pair, {m: traces[m] for m in ("via", "sd")}, reference=traces["ar"])
        text = json.dumps([rounded(traces[m].to_dict()) for m in METHODS], separators=(",", ":"), ensure_ascii=False)
        (out / f"{name}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        about = {"preset": args.preset, "prompt": prompt, "max_new_tokens": args.max_new_tokens,
                 "date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": os.cpu_count(),
                 "load_average": busy, "device": str(pair.device), "weights": pair.weights,
                 "fidelity": rounded(fidelity or {}), "command": "scripts/record_runs.py"}
        (out / f"{name}.about.json").write_text(json.dumps(about, indent=1) + "\n")
        speeds = {m: round(traces[m].summary["tokens_per_s"], 1) for m in METHODS}
        size = (out / f"{name}.json.gz").stat().st_size
        print(f"{name}: {speeds} tokens/s, fidelity {about['fidelity']}; {size} bytes")


if __name__ == "__main__":
    main()
