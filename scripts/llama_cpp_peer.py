"""Our AR and SD decoding against llama.cpp's own `llama-bench` on the embedded verifier's GGUF file, interleaved.

The peer is llama.cpp built natively from the sources in the llama-cpp-python sdist (its vendor/llama.cpp, with
-DGGML_NATIVE=ON and its tools; BENCHMARKS.md says how), run as its own `llama-bench` binary with the same
thread count as torch. Each round, for every prompt in turn (the order of the probes rotating):
  - llama.cpp decode: `llama-bench -m <verifier gguf> -t T -p 0 -n 64 -r 1` (tg64: 64 one-token steps);
  - our AR over 64 new tokens: tokens/s from round 1 on (round 0 reads the prompt, as tg64 does not) and whole;
  - our SD (gamma auto) on the same prompt: whole-run tokens/s, and whether its output equals AR's;
  - llama.cpp prompt processing: `llama-bench ... -p 64 -n 0 -r 1` (pp64), against one verifier pass of ours
    over a 64-token prompt (the last row's logits, as pp64 computes);
  - verification's flatness: llama.cpp's passes of 1, 4 and 8 new rows after a 200-token context (`llama-bench
    ... -p 1,4,8 -d 200 -n 0 -r 1`: its last row's logits only), against our verifier's passes over the same rows
    after as long a context (every row's logits, as a verification needs): V(k) = pass(k) / pass(1) for each.
Printed: medians, and ratios paired within a round (ours / llama.cpp measured next to each other).

    flock /tmp/via-sd-heavy.lock env HF_HUB_OFFLINE=1 .venv/bin/python scripts/llama_cpp_peer.py \
        --llama-bench /work/llama-build/build/bin/llama-bench [--rounds 3] [--limit 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from via_sd import DecodeConfig, generate, load_pair  # noqa: E402
from via_sd.weights.embedded import embedded_gguf_paths  # noqa: E402
from via_sd.bench.inputs import load_prompts  # noqa: E402
from via_sd.weights.machine import cpu_name  # noqa: E402


def run_llama_bench(binary: str, gguf: Path, threads: int, args: list[str], hint: str = "") -> list[dict]:
    """The tests of one `llama-bench` run (-r 1: one timed repetition after its own warm-up), as its JSON gives them;
    a failed run stops the bench with its command, the peer's own error and `hint`."""
    cmd = [binary, "-m", str(gguf), "-t", str(threads), *args, "-r", "1", "-o", "json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"llama-bench failed ({' '.join(cmd)}): {(run.stderr or run.stdout).strip()[-400:]}{hint}")
    return json.loads(run.stdout)


def llama_bench(binary: str, gguf: Path, threads: int, prompt: int, gen: int) -> float:
    """tokens/s of one `llama-bench` run over `prompt` prompt tokens or `gen` generated ones."""
    return float(run_llama_bench(binary, gguf, threads, ["-p", str(prompt), "-n", str(gen)])[0]["avg_ts"])


def llama_passes(binary: str, gguf: Path, threads: int, rows: list[int], context: int) -> dict[int, float]:
    """Milliseconds of one llama.cpp pass over k new tokens after `context` cached ones, for each k in `rows`."""
    tests = run_llama_bench(binary, gguf, threads, ["-p", ",".join(map(str, rows)), "-d", str(context), "-n", "0"],
                            hint="\n(a llama-bench from before -d, the context depth?) run with --verify-rows '' to "
                                 "skip the verification passes")
    return {int(test["n_prompt"]): test["avg_ns"] / 1e6 for test in tests}


def our_passes(pair, rows: list[int], context: int) -> dict[int, float]:
    """Milliseconds of one verifier pass of ours over k new tokens after `context` cached ones (every row's logits,
    as the decoders verify), the median of two, for each k in `rows`: kernel_breakdown.verify_curve's passes."""
    from kernel_breakdown import verify_curve  # scripts/, beside this one

    return {k: seconds * 1e3 for k, (seconds, _) in verify_curve(pair, context, rows, sweeps=2).items()}


def after_prompt(trace) -> float:
    """tokens/s from round 1 on (round 0 reads the prompt)."""
    later = [t for t in trace.tokens if t["round"] > 0]
    if len(trace.rounds) < 2 or not later:
        return trace.summary["tokens_per_s"]
    return 1000.0 * len(later) / max(trace.summary["wall_ms"] - trace.rounds[1]["start_ms"], 1e-9)


def our_prompt_read(pair, n: int) -> float:
    """tokens/s of one verifier pass over n prompt tokens into an empty cache, the last row's logits."""
    import torch

    ids = torch.randint(1000, 20000, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.inference_mode():
        start = time.perf_counter()
        pair.verifier(ids, use_cache=True, logits_to_keep=1)
        return n / (time.perf_counter() - start)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", "llama-bench"),
                    help="the llama-bench binary (default $LLAMA_BENCH, else on PATH)")
    ap.add_argument("--prompts", default="assets/prompts/held_out.jsonl")
    ap.add_argument("--limit", type=int, default=3, help="prompts per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--no-sd", action="store_true", help="AR only")
    ap.add_argument("--verify-rows", default="4,8", help="rows k of the verification passes compared ('' to skip)")
    ap.add_argument("--context", type=int, default=200, help="tokens cached before a verification pass")
    ap.add_argument("--json", help="also write every sample here")
    args = ap.parse_args(argv)

    import torch

    threads = torch.get_num_threads()
    _, verifier_gguf = embedded_gguf_paths()
    pair = load_pair("embedded")
    prompts = [p["prompt"] for p in load_prompts(args.prompts, limit=args.limit)]
    generate(pair, "Warm up.", "sd", DecodeConfig(max_new_tokens=4))
    probes = {
        "llama tg": lambda p: llama_bench(args.llama_bench, verifier_gguf, threads, 0, args.tokens),
        "ours ar": lambda p: generate(pair, p, "ar", DecodeConfig(max_new_tokens=args.tokens)),
        "llama pp": lambda p: llama_bench(args.llama_bench, verifier_gguf, threads, args.prompt_tokens, 0),
        "ours pp": lambda p: our_prompt_read(pair, args.prompt_tokens),
    }
    rows = [1] + [int(k) for k in args.verify_rows.split(",") if k.strip() and int(k) > 1]
    if len(rows) > 1:
        probes["llama verify"] = lambda p: llama_passes(args.llama_bench, verifier_gguf, threads, rows, args.context)
        probes["ours verify"] = lambda p: our_passes(pair, rows, args.context)
    if not args.no_sd:
        probes["ours sd"] = lambda p: generate(pair, p, "sd", DecodeConfig(max_new_tokens=args.tokens))
    samples = []
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            names = list(probes)
            shift = (r * len(prompts) + i) % len(names)
            row = {"round": r, "prompt": i}
            for name in names[shift:] + names[:shift]:
                row[name] = probes[name](prompt)
            ar, sd = row.pop("ours ar"), row.pop("ours sd", None)
            row.update({"ours ar": after_prompt(ar), "ours ar whole": ar.summary["tokens_per_s"]})
            for who in ("llama", "ours"):
                passes = row.pop(f"{who} verify", None)
                for k, ms in (passes or {}).items():
                    row[f"{who} pass {k}"] = ms
                    if k > 1:
                        row[f"{who} V({k})"] = ms / passes[1]
            if sd is not None:
                row.update({"ours sd": sd.summary["tokens_per_s"], "sd == ar": sd.token_ids == ar.token_ids})
            samples.append(row)
            print(json.dumps(row), flush=True)
    report(samples, pair, threads, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"kernels": pair.describe()["kernels"], "samples": samples}, indent=1))
    return 0


def report(samples: list[dict], pair, threads: int, args) -> None:
    med = lambda key: statistics.median(s[key] for s in samples)  # noqa: E731
    paired = lambda a, b: statistics.median(s[a] / s[b] for s in samples)  # noqa: E731
    print(f"\n{cpu_name()}; {threads} threads; {len(samples)} paired samples ({args.rounds} rounds x {args.limit} prompts)")
    print(f"ours: {pair.describe()['kernels']}\n")
    print("| probe | llama.cpp tokens/s | ours tokens/s | ours / llama.cpp (paired median) |\n|---|---|---|---|")
    print(f"| decode, {args.tokens} tokens (tg{args.tokens}; ours AR from round 1) | {med('llama tg'):.1f} | "
          f"{med('ours ar'):.1f} | **{paired('ours ar', 'llama tg'):.2f}x** |")
    print(f"| prompt, {args.prompt_tokens} tokens (pp{args.prompt_tokens}) | {med('llama pp'):.1f} | "
          f"{med('ours pp'):.1f} | {paired('ours pp', 'llama pp'):.2f}x |")
    rows = sorted(int(key.split()[-1]) for key in samples[0] if key.startswith("ours pass "))
    if rows:
        print(f"\nverification after a {args.context}-token context (a pass over k new rows; llama.cpp computes its "
              f"last row's logits, ours every row's):\n")
        print("| rows k | llama.cpp ms | llama.cpp V(k) | ours ms | ours V(k) | ours / llama.cpp speed (paired) |\n"
              "|---|---|---|---|---|---|")
        for k in rows:
            v = (lambda who: f"{med(f'{who} V({k})'):.2f}") if k > 1 else (lambda who: "1")
            print(f"| {k} | {med(f'llama pass {k}'):.1f} | {v('llama')} | {med(f'ours pass {k}'):.1f} | "
                  f"**{v('ours')}** | {paired(f'llama pass {k}', f'ours pass {k}'):.2f}x |")
    if "ours sd" in samples[0]:
        same = sum(s["sd == ar"] for s in samples) / len(samples)
        print(f"\nour SD, whole {args.tokens}-token runs: {med('ours sd'):.1f} tokens/s, **{paired('ours sd', 'ours ar whole'):.2f}x "
              f"our AR** (whole runs, paired; AR whole {med('ours ar whole'):.1f}), "
              f"{paired('ours sd', 'llama tg'):.2f}x llama.cpp tg{args.tokens}; output equal to AR in {same:.0%}")


if __name__ == "__main__":
    sys.exit(main())
