"""Threshold sweep for the presets (`paper`, `fastest`), embedded pair, on the tuning prompts.

Presets are chosen on assets/prompts/tuning.jsonl and reported on held_out.jsonl (scripts/cost_targets.py),
which no threshold was ever chosen on. Each prompt runs plain SD and every point back to back (order rotated per
prompt), with gamma="auto"; speed-up = median over prompts of the paired tokens/s ratio VIA-SD / SD; agreement =
full-model top-1 agreement (teacher-forced), pooled over prompts.
Run:  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/preset_sweep.py --json sweep.json \
      [--points draft:0.6:0.6,...] [--max-new-tokens 64]
"""
import argparse
import json
import os
import time
from pathlib import Path

from via_sd import DecodeConfig, Thresholds, load_pair
from via_sd.bench.metrics import metrics
from via_sd.bench.run import rotated, run_once, score_runs

POINTS = [("slim", 0.5, 0.3), ("draft", 0.6, 0.6), ("draft", 0.7, 0.7), ("draft", 0.8, 0.8), ("draft", 0.9, 0.9)]
ap = argparse.ArgumentParser()
ap.add_argument("--max-new-tokens", type=int, default=64)
ap.add_argument("--prompts", default="assets/prompts/tuning.jsonl")
ap.add_argument("--budget-s", type=float, default=1800)
ap.add_argument("--json")
ap.add_argument("--points", help="signal:accept:escalate,... instead of the default grid")
args = ap.parse_args()
if args.points:
    POINTS = [(s, float(a), float(e)) for s, a, e in (x.split(":") for x in args.points.split(","))]

prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
pair = load_pair("embedded")
base = DecodeConfig(max_new_tokens=args.max_new_tokens)
configs = {"sd": ("sd", base)}
for k, (signal, a, e) in enumerate(POINTS):
    configs[f"p{k}"] = ("via", DecodeConfig(max_new_tokens=args.max_new_tokens, thresholds=Thresholds(a, e, signal)))
run_once(pair, prompts[0]["prompt"], "sd", DecodeConfig(max_new_tokens=8))  # warm-up
t0, runs = time.time(), []
for i, p in enumerate(prompts):
    if time.time() - t0 > args.budget_s:
        print(f"budget reached after {i} prompts", flush=True)
        break
    for label in rotated(list(configs), i):
        method, cfg = configs[label]
        record, _ = run_once(pair, p["prompt"], method, cfg)
        record.update(label=label, prompt_index=i, task=p["task"], repeat=0)
        runs.append(record)
    print(f"prompt {i + 1}/{len(prompts)} done at {time.time() - t0:.0f}s", flush=True)
done = sorted({r["prompt_index"] for r in runs})
score_runs(pair, runs, prompts, base,
           label="label", reference="sd")
rows = []
for label, (method, cfg) in configs.items():
    m = metrics([r for r in runs if r["label"] == label], runs, label="label", ar=None, sd="sd", reference="sd")
    th = cfg.thresholds.to_dict() if method == "via" else {}
    rows.append({"label": label, "method": method, **th, "speedup_vs_sd": m["speedup_vs_sd"],
                 "agreement": m["agreement"], "tier_shares": m["tier_shares"], "rejection_rate": m["rejection_rate"],
                 "verified_rejection_rate": m["verified_rejection_rate"], "unverified_share": m["unverified_share"],
                 "tokens_per_s": m["tokens_per_s"], "full_calls_per_token": m["full_calls_per_token"],
                 "slim_calls_per_token": m["slim_calls_per_token"], "ms_per_call": m["ms_per_call"]})
print(f"embedded pair, route {pair.route.name} ({pair.route.skip_fraction:.3f} of sub-layers skipped), gamma auto, "
      f"{args.max_new_tokens} new tokens, {len(done)} prompts of {args.prompts} ({', '.join(prompts[i]['task'] for i in done)}), "
      f"load average at end {os.getloadavg()[0]:.1f}")
print("| signal | accept | escalate | × SD | agreement | tiers A/B/C | rejection rate (paper) | verified rejection rate "
      "| unverified share | full calls/token | slim calls/token |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    ts = r["tier_shares"]
    tiers = "/".join(f"{100 * ts[t]:.0f}%" for t in ("draft", "slim", "full")) if ts else "–"
    f = lambda v, fmt="{:.2f}": "–" if v is None else fmt.format(v)  # noqa: E731
    print(f"| {r.get('signal', 'SD')} | {f(r.get('accept'))} | {f(r.get('escalate'))} | {f(r['speedup_vs_sd'], '{:.3f}')} "
          f"| {f(r['agreement'], '{:.3f}')} | {tiers} | {f(r['rejection_rate'])} | {f(r['verified_rejection_rate'])} "
          f"| {f(r['unverified_share'])} | {f(r['full_calls_per_token'])} | {f(r['slim_calls_per_token'])} |")
sd_ms = next(r for r in rows if r["label"] == "sd")["ms_per_call"]
print("steady ms per call (SD run): ", {k: round(v, 1) if v else v for k, v in sd_ms.items()})
print("steady ms per call (first point): ", {k: round(v, 1) if v else v for k, v in rows[1]["ms_per_call"].items()})
if args.json:
    Path(args.json).write_text(json.dumps({"rows": rows, "runs": runs}, indent=1, default=str))
