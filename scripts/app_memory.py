"""Peak RSS of the app's process after one comparison: import app (gradio + the Blocks), run one
comparison through its own Run handler (VIA-SD then SD, 48 tokens, the embedded pair), read VmHWM.

    flock /tmp/via-sd-embedded.lock .venv/bin/python scripts/app_memory.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app  # noqa: E402
from scripts.lowbit_memory import vm  # noqa: E402
from via_sd import Thresholds  # noqa: E402

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def main() -> int:
    th, start, last = Thresholds(), time.time(), None
    for last in app.run_compare(PROMPT, "embedded", 5, th.accept, th.escalate, th.signal, 0.0, 48, 0, "default",
                                False, 0, None, lambda *a, **k: None):
        pass
    print({"seconds": round(time.time() - start, 1), "peak_rss_gb": round(vm("VmHWM"), 2),
           "rss_gb": round(vm("VmRSS"), 2), "traces": sorted(last[-1]) if isinstance(last[-1], dict) else None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
