"""Per weights setting: verifier pass cost over 1 and 6 new tokens, prefill, drafter cost, agreement with fp32.

    flock /tmp/via-sd-embedded.lock .venv/bin/python scripts/weights_passes.py --weights fp32,int4,int8-dyn,bf16

Each setting loads the embedded pair in turn (one at a time). Passes run after a 120-token
context held in the KV cache (rolled back after every pass), median of --repeat; prefill is
one forward over a 150-token prompt. Agreement: the fp32 verifier continues each prompt greedily
for --tokens tokens; every setting (fp32 included) then reads prompt + that continuation in one
forward, and we count how often its top-1 equals fp32's top-1 at the same position
(teacher-forced top-1 agreement with fp32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import DynamicCache  # noqa: E402

from via_sd import load_pair  # noqa: E402
from via_sd.bench.inputs import DEFAULT_PROMPTS, load_prompts  # noqa: E402


def timed(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


@torch.inference_mode()
def pass_ms(model, context: torch.Tensor, new: int, repeat: int) -> float:
    """One forward over `new` tokens after `context` is cached; the cache is cropped back each time."""
    cache = DynamicCache()
    model(context, past_key_values=cache, use_cache=True, logits_to_keep=1)
    extra = torch.randint(1000, 20000, (1, new), generator=torch.Generator().manual_seed(new))

    def run():
        model(extra, past_key_values=cache, use_cache=True, logits_to_keep=new)
        cache.crop(-new)
    return timed(run, repeat)


@torch.inference_mode()
def continuation(model, ids: list[int], tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def top1(model, refs) -> list[list[int]]:
    """Teacher-forced top-1 at every continuation position (one forward over prompt + continuation)."""
    return [model(torch.tensor([ids + cont])).logits[0, len(ids) - 1:-1].argmax(-1).tolist() for ids, cont in refs]


def agreement(mine: list[list[int]], reference: list[list[int]]) -> float:
    pairs = [(a, b) for x, y in zip(mine, reference) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / len(pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="fp32,int4,int8-dyn,bf16")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--limit", type=int, default=4, help="prompts for the agreement")
    parser.add_argument("--tokens", type=int, default=64, help="greedy fp32 tokens per prompt")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference", default="/tmp/via-sd-fp32-continuations.json",
                        help="fp32 continuations are cached here (reused when present)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    settings = args.weights.split(",")
    prompts = [p["prompt"] for p in load_prompts(args.prompts, limit=args.limit)]
    context = torch.randint(1000, 20000, (1, 120), generator=torch.Generator().manual_seed(0))
    prompt150 = torch.randint(1000, 20000, (1, 150), generator=torch.Generator().manual_seed(1))
    ref_path, refs, ref_top1, rows = Path(args.reference), None, None, []
    if ref_path.is_file():
        saved = json.loads(ref_path.read_text())
        if saved.get("prompts") == prompts and saved.get("tokens") == args.tokens:
            refs, ref_top1 = saved["refs"], saved.get("top1")
    if (refs is None or ref_top1 is None) and "fp32" not in settings:
        settings = ["fp32", *settings]
    settings = sorted(settings, key=lambda w: w != "fp32")  # fp32 first: it is the reference
    for weights in settings:
        t0 = time.perf_counter()
        pair = load_pair("embedded", weights=weights, route="none")
        load_s = time.perf_counter() - t0
        if refs is None:  # fp32 comes first: it defines the reference continuations
            refs = [(ids, continuation(pair.verifier, ids, args.tokens)) for ids in map(pair.encode, prompts)]
        mine = top1(pair.verifier, refs)
        if weights == "fp32":  # compared with fp32's own teacher-forced top-1 (not the generated text,
            ref_top1 = mine    # which min_new_tokens keeps from ending where fp32 would stop)
            ref_path.write_text(json.dumps({"prompts": prompts, "tokens": args.tokens, "refs": refs, "top1": mine}))
        v1 = pass_ms(pair.verifier, context, 1, args.repeat)
        v6 = pass_ms(pair.verifier, context, 6, args.repeat)
        d1 = pass_ms(pair.drafter, context, 1, args.repeat)
        with torch.inference_mode():
            prefill = timed(lambda: pair.verifier(prompt150, logits_to_keep=1), 1)
        row = {"weights": weights, "load_s": round(load_s, 1), "verify1_ms": round(v1, 1), "verify6_ms": round(v6, 1),
               "verify6_over_1": round(v6 / v1, 2), "drafter1_ms": round(d1, 1), "drafter_over_verifier": round(d1 / v1, 3),
               "prefill150_ms": round(prefill), "agreement": round(agreement(mine, ref_top1), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del pair
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
