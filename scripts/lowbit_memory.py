"""Load time and peak memory of the embedded pair in one weights setting, before and after one comparison.

    flock /tmp/via-sd-embedded.lock .venv/bin/python scripts/lowbit_memory.py --weights int4

A comparison = what the app's Run does by default: VIA-SD then plain SD on one prompt, 48 new tokens.
Peak RSS is the kernel's VmHWM of this process (the whole process: torch, transformers, both models).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from via_sd import DecodeConfig, generate, load_pair  # noqa: E402


def vm(field: str, pid: int | str = "self") -> float:
    """GB (10^9 bytes) of a /proc/<pid>/status field (VmHWM = peak resident set, VmRSS = now); nan if
    the process or field is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    t0 = time.perf_counter()
    pair = load_pair("embedded", weights=args.weights)
    out = {"weights": pair.weights, "load_s": round(time.perf_counter() - t0, 1),
           "rss_after_load_gb": round(vm("VmRSS"), 2), "peak_after_load_gb": round(vm("VmHWM"), 2)}
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens)
    for method in ("via", "sd"):
        t = time.perf_counter()
        trace = generate(pair, args.prompt, method, cfg)
        out[f"{method}_s"] = round(time.perf_counter() - t, 1)
        out[f"{method}_tokens"] = len(trace.token_ids)
    out["peak_after_comparison_gb"] = round(vm("VmHWM"), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
