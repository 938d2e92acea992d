"""Escalating-round cost with and without progressive verification, side by side on the same rounds.

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/progressive_cost.py   (embedded pair)
"""
import json
import statistics

import torch
from via_sd import DecodeConfig, Thresholds, generate, load_pair

torch.set_num_threads(2)
pair = load_pair("embedded")
prompts = [json.loads(open(f"assets/prompts/{t}.jsonl").read().splitlines()[1])["prompt"] for t in ("code", "qa")]
th = Thresholds(0.5, 0.3, "slim")
cost = {True: [], False: []}
for rep in range(2):
    for prompt in prompts:
        traces = {}
        for prog in ((True, False) if rep % 2 == 0 else (False, True)):
            cfg = DecodeConfig(gamma=5, max_new_tokens=24, thresholds=th, progressive=prog)
            traces[prog] = generate(pair, prompt, "via", cfg)
        assert traces[True].token_ids == traces[False].token_ids
        for prog, tr in traces.items():
            cost[prog] += [r["slim_ms"] + r["full_ms"] for r in tr.rounds[1:] if r["slim_called"] and r["full_called"]]
on, off = statistics.median(cost[True]), statistics.median(cost[False])
print(f"route {pair.route.name} first skip sub-layer {pair.slim.first_skip} of {pair.slim.sublayers}")
print(f"escalating rounds: {len(cost[True])} per setting; median slim+full ms: separate {off:.0f}, progressive {on:.0f}, "
      f"ratio progressive/separate {on/off:.3f}")
