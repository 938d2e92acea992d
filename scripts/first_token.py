"""How soon is the first token decided? The engine alone, warm, on a prompt of about 40 tokens.

For each method: milliseconds from the call to the first event that decides a token (stream_events'
"decided" event, or the first "round" for AR), median over the repeats, with where round 0's time went
(its recorded forwards: who read how many rows).

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/first_token.py [--repeats 3] [--preset embedded]
      [--whole-prompts: every run reads its prompt whole, not past the chat opening read once per pair]
"""
import argparse
import statistics
import time

from via_sd import DecodeConfig, Thresholds, load_pair
from via_sd.core.decoding import stream_events

PROMPT = "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."

parser = argparse.ArgumentParser()
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--preset", default="embedded")
parser.add_argument("--whole-prompts", action="store_true")
args = parser.parse_args()
reuse = not args.whole_prompts
pair = load_pair(args.preset)
print(f"prompt: {len(pair.encode(PROMPT))} tokens (chat template applied)")
settings = {"ar": ("ar", Thresholds()), "sd": ("sd", Thresholds()), "via paper": ("via", Thresholds.preset("paper")),
            "via fastest": ("via", Thresholds.preset("fastest"))}
for name, (method, th) in settings.items():  # warm: kernels, the cost profile, first-call costs
    for _ in stream_events(pair, PROMPT, method, DecodeConfig(max_new_tokens=4, thresholds=th, reuse_opening=reuse)):
        pass
for name, (method, th) in settings.items():
    firsts, calls = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        for event in stream_events(pair, PROMPT, method, DecodeConfig(max_new_tokens=8, thresholds=th, reuse_opening=reuse)):
            decided = event.kind == "round" or any(c["decision"] != "pending" for c in event.candidates)
            if decided:
                firsts.append(1000 * (time.perf_counter() - start))
                break
        for event in stream_events(pair, PROMPT, method, DecodeConfig(max_new_tokens=2, thresholds=th, reuse_opening=reuse)):
            calls = event.trace.rounds[0]["calls"] if event.kind == "round" else calls
    where = ", ".join(f"{c['model']} {c['rows']} rows" for c in calls or [])
    print(f"{name:12s} first decided token {statistics.median(firsts):6.0f} ms  (round 0: {where})", flush=True)
