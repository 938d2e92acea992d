"""Does the slim verifier lose agreement when it reads the full verifier's cache? And what does it save?

Runs VIA-SD with slim_cache="own" and "full" (the order alternating), paired per prompt, on the held-out
prompts, and prints each setting's full-model agreement (teacher-forced, via_sd.bench.fidelity), decode tokens/s,
tier shares and verifier rows read.

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/slim_cache.py [--tokens 64] [--presets paper,fastest]
"""
import argparse
import json
import statistics

from via_sd import DecodeConfig, Thresholds, generate, load_pair
from via_sd.bench.fidelity import measure_fidelity

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", type=int, default=64)
parser.add_argument("--presets", default="paper,fastest")
parser.add_argument("--prompts", default="assets/prompts/held_out.jsonl")
args = parser.parse_args()
pair = load_pair("embedded")
prompts = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()]
for preset in args.presets.split(","):
    out = {"own": [], "full": []}
    for i, prompt in enumerate(prompts):
        order = ("own", "full") if i % 2 == 0 else ("full", "own")
        for setting in order:
            cfg = DecodeConfig(max_new_tokens=args.tokens, thresholds=Thresholds.preset(preset), slim_cache=setting)
            trace = generate(pair, prompt, "via", cfg)
            fid = measure_fidelity(pair, trace)
            rows = sum(c["rows"] for r in trace.rounds for c in r["calls"] if c["model"] != "drafter")
            out[setting].append({"agreement": fid["agreement"], "tps": trace.summary["tokens_per_s"], "rows": rows,
                                 "tiers": trace.summary["tier_counts"]})
    own_tps = {i: r["tps"] for i, r in enumerate(out["own"])}
    for setting, runs in out.items():
        tiers = {t: sum(r["tiers"][t] for r in runs) for t in ("draft", "slim", "full")}
        total = sum(tiers.values())
        ratio = statistics.median(r["tps"] / own_tps[i] for i, r in enumerate(runs))
        print(f"{preset:8s} slim_cache={setting:4s} agreement {statistics.mean(r['agreement'] for r in runs):.3f} "
              f"tokens/s {statistics.median(r['tps'] for r in runs):.2f} (x{ratio:.2f} own, paired) "
              f"verifier rows {sum(r['rows'] for r in runs)} tiers "
              + "/".join(f"{100 * tiers[t] / total:.0f}%" for t in ("draft", "slim", "full")), flush=True)
