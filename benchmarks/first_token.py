"""How soon is the first token decided? The engine alone, warm, on a prompt of about 40 tokens.

For each method: milliseconds from the call to the first event that decides a token (stream_events'
"decided" event, or the first "round" for AR), median over the repeats, with where round 0's time went
(its recorded forwards: who read how many rows).

    .venv/bin/python -m benchmarks.first_token [--repeats 3] [--preset embedded]
        [--whole-prompts: every run reads its prompt whole, not past the chat opening read once per pair]
"""

from __future__ import annotations

import statistics
import time

from benchmarks.harness import parser, run_main
from via_sd import DecodeConfig, Thresholds, load_pair
from via_sd.core.decoding import stream_events

PROMPT = "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."
SETTINGS = {"ar": ("ar", Thresholds()), "sd": ("sd", Thresholds()), "via paper": ("via", Thresholds.preset("paper")),
            "via fastest": ("via", Thresholds.preset("fastest"))}


def first_decided_ms(pair, method: str, config: DecodeConfig) -> float:
    start = time.perf_counter()
    for event in stream_events(pair, PROMPT, method, config):
        if event.kind == "round" or any(c["decision"] != "pending" for c in event.candidates):
            break
    return 1000 * (time.perf_counter() - start)


def main(argv=None) -> int:
    ap = parser(__doc__, tokens=8)
    ap.set_defaults(repeats=3)
    ap.add_argument("--whole-prompts", action="store_true")
    args = ap.parse_args(argv)
    reuse, repeats = not args.whole_prompts, args.repeats
    pair = load_pair(args.preset)
    print(f"prompt: {len(pair.encode(PROMPT))} tokens (chat template applied)")
    for method, th in SETTINGS.values():  # warm: kernels, the cost profile, first-call costs
        for _ in stream_events(pair, PROMPT, method, DecodeConfig(max_new_tokens=4, thresholds=th,
                                                                   reuse_opening=reuse)):
            pass
    for name, (method, th) in SETTINGS.items():
        cfg = DecodeConfig(max_new_tokens=args.tokens, thresholds=th, reuse_opening=reuse)
        firsts = [first_decided_ms(pair, method, cfg) for _ in range(repeats)]
        calls = None
        for event in stream_events(pair, PROMPT, method, DecodeConfig(max_new_tokens=2, thresholds=th,
                                                                        reuse_opening=reuse)):
            calls = event.trace.rounds[0]["calls"] if event.kind == "round" else calls
        where = ", ".join(f"{c['model']} {c['rows']} rows" for c in calls or [])
        print(f"{name:12s} first decided token {statistics.median(firsts):6.0f} ms  (round 0: {where})", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
