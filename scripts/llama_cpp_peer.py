"""llama.cpp's raw speeds on the embedded verifier's Q4_K_M file, next to ours on the same machine (issue 29).

Prints, for llama.cpp (llama-cpp-python, built by `pip install -r requirements-peers.txt`) and for our verifier
(`load_pair("embedded")`, whichever int4 kernel this checkout has: the `kernels` line says which):
  - decode tokens/s: TOKENS one-token passes after a one-token context (as `llama-bench -n 64`), greedy-fed;
  - prompt tokens/s: reading PROMPT tokens into an empty cache (as `llama-bench -p N`), logits for the last row;
  - verify(k): one pass over k rows after a CONTEXT-token context (as our cost profile, core/profile.py), in ms,
    and V(k) = verify(k) / verify(1). llama.cpp twice: logits for the last row only (what `llama-bench -p k -n 0`
    times) and for all k rows (what verifying k drafts needs; ours always computes all k).
Every probe runs once per sweep, llama.cpp's and ours interleaved, and keeps the median over the sweeps. Tokens
are fixed pseudo-random ids (a pass costs the same whatever they are). Threads: torch's count for both.

Run (under the shared machine's lock):
    flock /tmp/heavy.lock env HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python scripts/llama_cpp_peer.py \
        [--sweeps 5] [--rows 1,2,3,4,5,8] [--no-ours] [--json out.json]
"""
import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

from via_sd.bench.gguf_files import embedded_gguf_paths
from via_sd.bench.llama_peer import NOT_INSTALLED, installed, last_logits, load_llama, threads

parser = argparse.ArgumentParser()
parser.add_argument("--sweeps", type=int, default=5)
parser.add_argument("--tokens", type=int, default=64, help="decode steps timed")
parser.add_argument("--context", type=int, default=200, help="tokens cached before a verify(k) pass")
parser.add_argument("--rows", default="1,2,3,4,5,8")
parser.add_argument("--prompts", default="40,128", help="prompt lengths read")
parser.add_argument("--no-ours", action="store_true", help="llama.cpp only (does not load our pair)")
parser.add_argument("--json", help="also write every sample here")
args = parser.parse_args()
if not installed():
    sys.exit(NOT_INSTALLED)
ROWS = [int(k) for k in args.rows.split(",")]
PROMPTS = [int(n) for n in args.prompts.split(",")]
SEQ = np.random.default_rng(0).integers(1000, 150000, size=args.context + max(ROWS) + max(PROMPTS) + 8).tolist()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return 1000.0 * (time.perf_counter() - start)


class LlamaProbes:
    def __init__(self):
        _, verifier = embedded_gguf_paths()
        self.m = load_llama(verifier, n_ctx=1024)

    def _at(self, n):  # keep the first n cached tokens, forget the rest
        self.m.n_tokens = n
        self.m.eval([])

    def decode(self):
        self._at(0)
        self.m.eval(SEQ[:1])

        def steps():
            for _ in range(args.tokens):
                self.m.eval([int(np.argmax(last_logits(self.m)))])
        return timed(steps)

    def prompt(self, n):
        self._at(0)
        return timed(lambda: self.m.eval(SEQ[:n]))

    def verify(self, k, all_rows):
        if self.m.n_tokens < args.context or self.m.input_ids[: args.context].tolist() != SEQ[: args.context]:
            self._at(0)
            self.m.eval(SEQ[: args.context])
        self._at(args.context)
        saved, self.m._logits_all = self.m._logits_all, all_rows
        try:
            return timed(lambda: self.m.eval(SEQ[args.context: args.context + k]))
        finally:
            self.m._logits_all = saved


class OurProbes:
    def __init__(self):
        import torch

        from via_sd import load_pair
        from via_sd.core.cached import CachedModel

        self.torch, self.CachedModel = torch, CachedModel
        self.pair = load_pair("embedded")
        self.kernels = self.pair.describe()["kernels"]
        self.verifier = self._fresh()
        self.verifier.logits(SEQ, args.context, 1)

    def _fresh(self):
        out = self.pair.drafter.device
        return self.CachedModel(self.pair.verifier, self.pair.vocab_size, out, out)

    def decode(self):
        m, fed = self._fresh(), SEQ[:1]
        last = m.logits(fed, 1, 1)

        def steps():
            nonlocal last
            for _ in range(args.tokens):
                fed.append(int(last[-1].argmax()))
                last = m.logits(fed, len(fed), 1)
        return timed(steps)

    def prompt(self, n):
        m = self._fresh()
        return timed(lambda: m.logits(SEQ, n, 1))

    def verify(self, k):
        self.verifier.rollback(args.context)
        return timed(lambda: self.verifier.logits(SEQ, args.context + k, k))


def sweep(llama, ours, samples):
    def add(key, ms):
        samples.setdefault(key, []).append(ms)

    add(("llama", "decode"), llama.decode())
    if ours:
        add(("ours", "decode"), ours.decode())
    for n in PROMPTS:
        add(("llama", f"prompt {n}"), llama.prompt(n))
        if ours:
            add(("ours", f"prompt {n}"), ours.prompt(n))
    for k in ROWS:
        add(("llama", f"verify {k} last"), llama.verify(k, False))
        add(("llama", f"verify {k} all"), llama.verify(k, True))
        if ours:
            add(("ours", f"verify {k}"), ours.verify(k))


def report(samples, ours):
    med = {key: statistics.median(v) for key, v in samples.items()}
    rate = lambda n, ms: 1000.0 * n / ms if ms else None  # noqa: E731
    fmt = lambda v, f="{:.1f}": "–" if v is None else f.format(v)  # noqa: E731
    get = lambda who, what: med.get((who, what))  # noqa: E731
    print(f"\nCPU: {cpu()}; threads {threads()}; {args.sweeps} sweeps, medians")
    print(f"ours: {ours.kernels if ours else 'not measured (--no-ours)'}\n")
    print("| | llama.cpp | ours | ours / llama.cpp |\n|---|---|---|---|")
    rows = [(f"decode tokens/s ({args.tokens} tokens)", args.tokens, "decode")]
    rows += [(f"prompt tokens/s ({n} tokens)", n, f"prompt {n}") for n in PROMPTS]
    for label, n, what in rows:
        a, b = rate(n, get("llama", what)), rate(n, get("ours", what)) if ours else None
        print(f"| {label} | {fmt(a)} | {fmt(b)} | {fmt(b / a if a and b else None, '{:.2f}x')} |")
    print("\n| k rows | llama.cpp ms (last row's logits) | V(k) | llama.cpp ms (all rows' logits) | V(k) | "
          "ours ms | V(k) |\n|---|---|---|---|---|---|---|")
    base = {w: get(*w) for w in (("llama", "verify 1 last"), ("llama", "verify 1 all"), ("ours", "verify 1"))}
    for k in ROWS:
        cells = []
        for who, what in (("llama", f"verify {k} last"), ("llama", f"verify {k} all"), ("ours", f"verify {k}")):
            ms, one = get(who, what), base[(who, what.replace(f"verify {k}", "verify 1"))]
            cells += [fmt(ms), fmt(ms / one if ms and one else None, "{:.2f}")]
        print(f"| {k} | " + " | ".join(cells) + " |")
    return med


def cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main():
    import llama_cpp

    llama = LlamaProbes()
    ours = None if args.no_ours else OurProbes()
    llama.decode()  # warm both: first passes pay for allocation
    if ours:
        ours.decode()
    samples = {}
    for s in range(args.sweeps):
        sweep(llama, ours, samples)
        print(f"sweep {s + 1}/{args.sweeps} done", file=sys.stderr, flush=True)
    med = report(samples, ours)
    if args.json:
        info = {"cpu": cpu(), "threads": threads(), "llama_cpp_python": llama_cpp.__version__,
                "llama_system_info": llama_cpp.llama_print_system_info().decode(),
                "ours_kernels": ours.kernels if ours else None, "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump({"info": info, "median_ms": {" ".join(k): v for k, v in med.items()},
                       "samples_ms": {" ".join(k): v for k, v in samples.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
