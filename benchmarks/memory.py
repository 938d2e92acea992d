"""Load time and peak memory of a pair around one comparison: the engine alone, or the app's own Run handler.

    .venv/bin/python -m benchmarks.memory --weights int4     # load_pair, then VIA-SD and plain SD on one prompt
    .venv/bin/python -m benchmarks.memory --app              # import app, one comparison through its Run handler
                                                             # (VIA-SD, SD, AR, as the page does) and fidelity

Peak RSS is the kernel's VmHWM of this process (the whole process: torch, transformers, both models, and with
--app gradio and the page's Blocks). One JSON line.
"""

from __future__ import annotations

import json
import time

from benchmarks.harness import run_main, vm

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def engine(preset: str, weights: str, tokens: int) -> dict:
    from via_sd import DecodeConfig, generate, load_pair

    t0 = time.perf_counter()
    pair = load_pair(preset, weights=weights)
    out = {"weights": pair.weights, "load_s": round(time.perf_counter() - t0, 1),
           "rss_after_load_gb": round(vm("VmRSS"), 2), "peak_after_load_gb": round(vm("VmHWM"), 2)}
    for method in ("via", "sd"):
        t = time.perf_counter()
        trace = generate(pair, PROMPT, method, DecodeConfig(max_new_tokens=tokens))
        out[f"{method}_s"] = round(time.perf_counter() - t, 1)
        out[f"{method}_tokens"] = len(trace.token_ids)
    return out


def app(preset: str, tokens: int) -> dict:
    import app  # noqa: F401  (the page's imports and Blocks count too)
    from studio import runs
    from via_sd import Thresholds

    th, start, last = Thresholds(), time.time(), None
    for last in runs.run_compare(PROMPT, preset, 5, th.accept, th.escalate, th.signal, 0.0, tokens, 0, "default",
                                 True, 0, progress=lambda *a, **k: None):
        pass
    runs.fidelity_after_run(last[-1])
    return {"seconds": round(time.time() - start, 1), "traces": sorted(m for m in last[-1] if m in runs.METHODS)}


def main(argv=None) -> int:
    from benchmarks.harness import parser

    ap = parser(__doc__, tokens=48)
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--app", action="store_true", help="through the app's own Run handler (studio.runs)")
    args = ap.parse_args(argv)
    out = app(args.preset, args.tokens) if args.app else engine(args.preset, args.weights, args.tokens)
    out.update(peak_rss_gb=round(vm("VmHWM"), 2), rss_gb=round(vm("VmRSS"), 2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    run_main(main)
