"""What the machine-independent forward costs: a verifier step, a prompt read and a drafter step, with ATen pinned
to AVX2 and the fixed-order attention (as decoding runs) against ATen's own choice and torch's SDPA (as before),
and against the other way (ATen pinned, SDPA kept, MKL pinned to its COMPATIBLE branch, the only one Intel's
documentation promises on other vendors' CPUs).

    .venv/bin/python -m benchmarks.code_path_cost --preset embedded --rounds 3

ATen's code path is fixed per process, so each round runs three child processes, pinned, native
(VIA_SD_ATEN=native) and pinned with MKL_CBWR=COMPATIBLE, in rotating order; inside each the attention alternates between the kernel's and SDPA
step by step. Printed: median milliseconds per setting, and today -> invariant as a paired ratio (median of the
rounds' ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.harness import ROOT, run_main


def child(preset: str, steps: int, context: int) -> dict:
    """In this process (one ATen path): ms per verifier step, prompt read and drafter step, each attention."""
    import torch
    from transformers import DynamicCache

    from via_sd import load_pair
    from via_sd.weights import lowbit_kernel
    from via_sd.weights.lean_forward import LeanDecoder, supports

    pair = load_pair(preset)
    vocab = pair.verifier.config.vocab_size
    ids = torch.randint(min(100, vocab // 2), min(vocab, 20000), (1, context + steps),
                        generator=torch.Generator().manual_seed(0))
    fixed = lowbit_kernel.has_attention

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000

    @torch.inference_mode()
    def verifier_steps() -> list[float]:
        cache = DynamicCache()
        pair.verifier(ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
        return [timed(lambda i=i: pair.verifier(ids[:, context + i:context + i + 1], past_key_values=cache,
                                                use_cache=True, logits_to_keep=1)) for i in range(steps)]

    @torch.inference_mode()
    def prompt_read() -> list[float]:
        return [timed(lambda: pair.verifier(ids[:, :context], use_cache=True, logits_to_keep=1))]

    def drafter_steps() -> list[float]:
        if not supports(pair.drafter):
            return []
        lean = LeanDecoder(pair.drafter, pair.drafter.config.vocab_size, torch.device("cpu"), torch.device("cpu"))
        seq = ids[0].tolist()
        lean.logits(seq, context, 1)
        return [timed(lambda i=i: lean.logits(seq, context + i + 1, 1)) for i in range(steps)]

    times: dict[str, list[float]] = {}
    for repeat in range(2):
        for attention in (("fixed", "sdpa") if repeat % 2 == 0 else ("sdpa", "fixed")):
            lowbit_kernel.has_attention = fixed if attention == "fixed" else (lambda: False)
            for part, run in (("verifier step", verifier_steps), ("prompt read", prompt_read),
                              ("drafter step", drafter_steps)):
                times.setdefault(f"{part} {attention}", []).extend(run()[1:] if part != "prompt read" else run())
    lowbit_kernel.has_attention = fixed
    return {key: statistics.median(v) for key, v in times.items() if v} | \
        {"aten": torch.backends.cpu.get_cpu_capability()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="embedded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="one-token steps per setting and repeat")
    parser.add_argument("--context", type=int, default=200,
                        help="tokens cached before the steps; the prompt read's length")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.preset, args.steps, args.context)))
        return 0
    rounds = []
    for r in range(args.rounds):
        row = {}
        order = ["pinned", "native", "compatible"]
        for aten in order[r % 3:] + order[:r % 3]:
            env = dict(os.environ, VIA_SD_ATEN="native" if aten == "native" else "")
            if aten == "compatible":  # the other way: SDPA kept, MKL pinned to the one branch it promises on AMD too
                env["MKL_CBWR"] = "COMPATIBLE"
            out = subprocess.run([sys.executable, "-m", "benchmarks.code_path_cost", "--child", "--preset", args.preset, "--steps",
                                  str(args.steps), "--context", str(args.context)], env=env, capture_output=True,
                                 text=True, check=True, cwd=ROOT)
            row[aten] = json.loads(out.stdout.strip().splitlines()[-1])
        rounds.append(row)
        print(f"round {r + 1}: " + json.dumps(row), flush=True)
    print(f"\n{'ms (median of rounds)':<18}{'today':>10}{'AVX2 + fixed order':>22}{'ratio':>8}"
          f"{'AVX2 + MKL COMPATIBLE + SDPA':>30}{'ratio':>8}")
    print(f"{'':<18}{'(native, SDPA)':>10}{'(chosen)':>22}")
    for part in ("verifier step", "prompt read", "drafter step"):
        if f"{part} fixed" not in rounds[0]["pinned"]:
            continue
        today = [row["native"][f"{part} sdpa"] for row in rounds]
        cells = []
        for ways in ([row["pinned"][f"{part} fixed"] for row in rounds],
                     [row["compatible"][f"{part} sdpa"] for row in rounds]):
            cells.append((statistics.median(ways), statistics.median(n / t for n, t in zip(ways, today))))
        print(f"{part:<18}{statistics.median(today):>10.2f}{cells[0][0]:>22.2f}{cells[0][1]:>8.3f}"
              f"{cells[1][0]:>30.2f}{cells[1][1]:>8.3f}")
    print("(ATen paths: pinned", rounds[0]["pinned"]["aten"], "native", rounds[0]["native"]["aten"] + ")")
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:  # a child of a run that holds the lock already
        sys.exit(main(sys.argv[1:]))
    run_main(main)
