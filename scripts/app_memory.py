"""Peak RSS of the app's process after one comparison: import app (gradio + the Blocks), run one
comparison through its own Run handler (VIA-SD, SD then AR, as the page does by default; 48 tokens,
the embedded pair) and its fidelity step, read VmHWM.

    flock /tmp/viasd-heavy.lock .venv/bin/python scripts/app_memory.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app  # noqa: E402,F401  (the page's imports and Blocks count too)
from scripts.lowbit_memory import vm  # noqa: E402
from studio import runs  # noqa: E402
from via_sd import Thresholds  # noqa: E402

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def main() -> int:
    th, start, last = Thresholds(), time.time(), None
    for last in runs.run_compare(PROMPT, "embedded", 5, th.accept, th.escalate, th.signal, 0.0, 48, 0, "default",
                                 True, 0, progress=lambda *a, **k: None):
        pass
    runs.fidelity_after_run(last[-1])
    print({"seconds": round(time.time() - start, 1), "peak_rss_gb": round(vm("VmHWM"), 2),
           "rss_gb": round(vm("VmRSS"), 2), "traces": sorted(m for m in last[-1] if m in runs.METHODS)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
