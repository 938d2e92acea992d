"""When each step of the app's model load begins, and when the pair is ready: a start's time, step by step.

The load the page shows (studio.models, studio.loading), run in this process without a page: imports, then each
step of the load line as it begins (unpacking, the kernel, loading, measuring, warming up), then ready.

Run:  flock /tmp/via-sd-heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/load_steps.py
      [--preset embedded]   (a cold start: VIA_SD_CACHE=an empty folder)
"""
import argparse
import time

start = time.perf_counter()
import studio.models as models  # noqa: E402  (the imports are part of a start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="embedded")
    args = parser.parse_args()
    print(f"{time.perf_counter() - start:7.1f} s  imports done", flush=True)
    pair_models = models.Models(args.preset)
    pair_models.preload(args.preset)
    shown = None
    while pair_models.loaded(args.preset) is None:
        load = pair_models.load_progress(args.preset)
        if load is None:  # the load ended without a pair
            print(pair_models.status(args.preset))
            return
        step = load[1].split(" · ")[0]
        if step != shown:
            print(f"{time.perf_counter() - start:7.1f} s  {load[0]:4.0%}  {step}", flush=True)
            shown = step
        time.sleep(0.05)
    print(f"{time.perf_counter() - start:7.1f} s  ready", flush=True)


if __name__ == "__main__":
    main()
