"""What the kernel rule costs a prompt read: each model of the embedded pair reads prompts of several lengths
through torch's int4 kernel (the rule, via_sd/weights/linears.py) and through de-quantized bf16 matmuls, paired.

    HF_HUB_OFFLINE=1 PYTHONPATH=. flock /tmp/heavy.lock .venv/bin/python scripts/prompt_read_paths.py [--lengths 32,128,512]

Prints one JSON line per (length, model): the best of three reads each way (after one warm-up), alternating the
order, and kernel / dense (below 1: the kernel is faster).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from via_sd import load_pair  # noqa: E402
from weights_passes import _set_dense  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--lengths", default="32,128,512")
args = parser.parse_args()
pair = load_pair("embedded", weights="int4")
for length in map(int, args.lengths.split(",")):
    ids = torch.randint(1000, 20000, (1, length), generator=torch.Generator().manual_seed(length))
    for name, model in (("verifier", pair.verifier), ("drafter", pair.drafter)):
        got = {"kernel": [], "dense": []}
        for rep in range(4):
            for path in ("kernel", "dense") if rep % 2 else ("dense", "kernel"):
                _set_dense(model, path == "dense")
                with torch.inference_mode():
                    start = time.perf_counter()
                    model(ids, logits_to_keep=1)
                    got[path].append((time.perf_counter() - start) * 1000)
        _set_dense(model, False)
        kernel, dense = min(got["kernel"][1:]), min(got["dense"][1:])
        print(json.dumps({"prompt": length, "model": name, "kernel_ms": round(kernel, 1), "dense_ms": round(dense, 1),
                          "kernel_over_dense": round(kernel / dense, 2)}), flush=True)
