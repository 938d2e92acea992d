"""What reading the chat opening once per pair (via_sd/core/opening.py) saves, paired per prompt.

For every held-out prompt and each setting, a run that starts from the kept opening and one that reads its whole
prompt (DecodeConfig(reuse_opening=False)), back to back, the order alternating; greedy, gamma="auto", 64 new
tokens. Printed per setting: the median paired ratio of whole-run speed (opening / whole prompt), round 0's
milliseconds both ways, and whether the two runs emitted the same tokens.

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/opening_gain.py [--tokens 64] [--repeats 2]
"""
import argparse
import json
import statistics

from via_sd import DecodeConfig, Thresholds, generate, load_pair

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", type=int, default=64)
parser.add_argument("--prompts", default="assets/prompts/held_out.jsonl")
parser.add_argument("--preset", default="embedded")
parser.add_argument("--repeats", type=int, default=2)
args = parser.parse_args()

pair = load_pair(args.preset)
prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()] * args.repeats
SETTINGS = {"ar": ("ar", Thresholds()), "sd": ("sd", Thresholds()), "fastest": ("via", Thresholds.preset("fastest"))}
for method, th in SETTINGS.values():  # warm, and the opening read into every kind of cache
    generate(pair, "Warm up.", method, DecodeConfig(max_new_tokens=4, thresholds=th))


def round0_ms(trace) -> float:
    return trace.rounds[1]["start_ms"] if len(trace.rounds) > 1 else trace.summary["wall_ms"]


rows = {name: [] for name in SETTINGS}
for i, prompt in enumerate(prompts):
    for name, (method, th) in SETTINGS.items():
        runs = {}
        for reuse in ((True, False) if i % 2 == 0 else (False, True)):
            cfg = DecodeConfig(max_new_tokens=args.tokens, thresholds=th, reuse_opening=reuse)
            runs[reuse] = generate(pair, prompt, method, cfg)
        on, off = runs[True], runs[False]
        rows[name].append({"ratio": on.summary["tokens_per_s"] / off.summary["tokens_per_s"],
                           "r0_on": round0_ms(on), "r0_off": round0_ms(off), "same": on.token_ids == off.token_ids,
                           "opening": on.summary["opening_tokens"], "prompt": on.summary["prompt_tokens"]})
    print(f"prompt {i}: " + ", ".join(f"{n} {r[-1]['ratio']:.2f}x" for n, r in rows.items()), flush=True)

print(f"\nopening: {rows['ar'][0]['opening']} tokens; prompts {sorted({r['prompt'] for r in rows['ar']})} tokens")
print("| setting | speed, opening / whole prompt (median) | round 0 ms: opening / whole (medians) | same tokens |")
print("|---|---|---|---|")
for name, rs in rows.items():
    print(f"| {name} | {statistics.median(r['ratio'] for r in rs):.2f}x | "
          f"{statistics.median(r['r0_on'] for r in rs):.0f} / {statistics.median(r['r0_off'] for r in rs):.0f} | "
          f"{sum(r['same'] for r in rs)}/{len(rs)} |")
