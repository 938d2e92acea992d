"""What the kernel rule costs a prompt read: each model of the embedded pair reads prompts of several lengths
through torch's int4 kernel (the rule, via_sd/weights/linears.py) and through de-quantized bf16 matmuls, paired.

    HF_HUB_OFFLINE=1 PYTHONPATH=. flock /tmp/heavy.lock .venv/bin/python scripts/prompt_read_paths.py [--lengths 32,128,512]

Prints one JSON line per (length, model): the best of two reads each way, alternating (weights_passes.prompt_read_ms),
and kernel / dense (below 1: the kernel is faster).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from via_sd import load_pair  # noqa: E402
from weights_passes import prompt_read_ms  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--lengths", default="32,128,512")
args = parser.parse_args()
pair = load_pair("embedded", weights="int4")
for length in map(int, args.lengths.split(",")):
    ids = torch.randint(1000, 20000, (1, length), generator=torch.Generator().manual_seed(length))
    for name, model in (("verifier", pair.verifier), ("drafter", pair.drafter)):
        ms = prompt_read_ms(model, ids)
        print(json.dumps({"prompt": length, "model": name, "kernel_ms": ms["kernel"], "dense_ms": ms["dense"],
                          "kernel_over_dense": round(ms["kernel"] / ms["dense"], 2)}), flush=True)
