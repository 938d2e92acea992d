"""How well a cost profile predicts runs, kept as it is and corrected from them: comparisons recorded, then replayed.

    .venv/bin/python -m benchmarks.profile_replay --record runs.json [--limit 4] [--repeats 2] [--tokens 24]
    .venv/bin/python -m benchmarks.profile_replay --replay runs.json [more.json ...] [--profile FILE]

--record decodes each prompt with VIA-SD, SD and AR one after another (a comparison, as the app's Run and /compare
make one) and writes every comparison's traces, each with its passes' milliseconds and the profile that priced it.
--replay walks the comparisons in order. Each is priced with the profile at hand, and its predicted speed-ups (SD /
AR, VIA-SD / AR, VIA-SD / SD) and tokens/s are set against the measured ones. Then its passes correct the profile
as the app's runs do (via_sd.cost.refine.keep_honest). It prints both columns: the starting profile kept as it is,
and corrected. The start is --profile (a shipped prior or a cache's profile file), else the profile that priced the
first comparison.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.harness import parser, prompts, run_main
from via_sd import DecodeConfig, generate, load_pair
from via_sd.cost.model import CostProfile, predict
from via_sd.cost.refine import Evidence, keep_honest

METHODS = ("via", "sd", "ar")  # the app's order
RATIOS = {"SD/AR": ("sd", "ar"), "VIA-SD/AR": ("via", "ar"), "VIA-SD/SD": ("via", "sd")}


def record(args) -> list[list[dict]]:
    pair, config = load_pair(args.preset), DecodeConfig(max_new_tokens=args.tokens)
    comparisons = []
    for item in prompts(args):
        comparisons.append([generate(pair, item["prompt"], m, config).to_dict() for m in METHODS])
        print(f"recorded {len(comparisons)}: {item['prompt'][:60]!r}", flush=True)
    return comparisons


def speedups(tokens_per_s: dict) -> dict:
    return {name: tokens_per_s[a] / tokens_per_s[b] for name, (a, b) in RATIOS.items()}


def replay(comparisons: list[list[dict]], start: CostProfile) -> dict:
    """{"kept" | "corrected": [(worst speed-up error, [tokens/s errors]) per comparison]}, printing each."""
    out = {}
    for name in ("kept", "corrected"):
        profile, evidence, rows = start, Evidence(), []
        for i, traces in enumerate(comparisons):
            runs = {t["method"]: t for t in traces}
            measured = {m: t["summary"]["tokens_per_s"] for m, t in runs.items()}
            predicted = predict(profile, runs)["tokens_per_s"]
            want, got = speedups(predicted), speedups(measured)
            worst = max(abs(want[k] / got[k] - 1) for k in RATIOS)
            rows.append((worst, [abs(predicted[m] / measured[m] - 1) for m in runs]))
            print(f"{name:9s} {i + 1:3d}  " + "  ".join(f"{k} {want[k]:.2f} / {got[k]:.2f}" for k in RATIOS) +
                  f"  worst {worst:.0%}", flush=True)
            if name == "corrected":
                for t in traces:
                    evidence.add_run(t)
                profile = keep_honest(profile, evidence, "replayed")
        out[name] = rows
    return out


def main(argv=None) -> int:
    ap = parser(__doc__, tokens=24)
    ap.add_argument("--record", help="decode the prompts and write their comparisons here")
    ap.add_argument("--replay", nargs="+", help="comparison files, replayed in the order given")
    ap.add_argument("--profile", help="the profile to start from (JSON: a shipped prior or a cache's profile file)")
    args = ap.parse_args(argv)
    if args.record:
        Path(args.record).write_text(json.dumps(record(args)))
    if not args.replay:
        return 0
    comparisons = [c for path in args.replay for c in json.loads(Path(path).read_text())]
    if args.profile:
        start = json.loads(Path(args.profile).read_text())
        start = CostProfile.from_dict(start.get("profile", start))
    else:
        start = CostProfile.from_dict(comparisons[0][0]["costs"])
    print(f"{len(comparisons)} comparisons; start: {args.profile or start.source}; predicted / measured")
    for name, rows in replay(comparisons, start).items():
        print(f"{name}: worst speed-up error per comparison, median {statistics.median(w for w, _ in rows):.0%}; "
              f"tokens/s error, median {statistics.median(e for _, errs in rows for e in errs):.0%}")
    return 0


if __name__ == "__main__":
    run_main(main)
