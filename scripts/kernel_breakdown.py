"""Where a verifier step's time goes, next to this CPU's limits.

Prints, for the pair's verifier in int4 weights:
  1. the machine's roofline: memory read bandwidth (every thread streaming its share of a 1 GiB buffer through
     vector loads, as a memory benchmark reads: bandwidth.cpp), the peak of the dot-product instruction the
     kernel multiplies with (from registers, every thread), the low-bit kernel's own rate on a cache-resident
     layer, torch's fp32 matmul peak;
  2. one-token decoding steps after a prompt, run as the decoders run them (core.cached.model_cache: the lean forward
     on the kernel), by part: each low-bit linear shape (calls, ms a call, the bytes it reads, the rate it reads
     them at and its share of the bandwidth), attention (rope, cache writes, attention), the head's exact
     re-scoring, everything else, the linears together and the bytes a step reads; its share of the bandwidth is of
     the read probe run between its blocks of steps;
  3. one linear (`--linear`, the verifier's MLP shape) at each row count, both kernels, weights from memory;
  4. with `--compare-forward`, one-token steps through the lean forward and through transformers' forward (the
     verifier's forward before issue #39), in alternating blocks;
  5. where a pass's products (its rows at the dot-product peak) outweigh its reads (its weights at the bandwidth);
     a verifier pass over k new tokens after `--context` tokens, V(k) = verify(k) / verify(1) (the median of the
     ratios of each sweep's passes), for the project's kernel, then for torch's (the pair built again with
     lowbit_kernel.off()).

    .venv/bin/python scripts/kernel_breakdown.py                 # the embedded pair (a few minutes)
    .venv/bin/python scripts/kernel_breakdown.py --preset random --steps 3 --context 16 --rows 1,2 --linear 64x64
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from via_sd import load_pair  # noqa: E402
from via_sd.core.cached import CachedModel, model_cache  # noqa: E402
from via_sd.weights import lowbit_kernel  # noqa: E402
from via_sd.weights.heads import RescoredHead  # noqa: E402
from via_sd.weights.linears import Int4Linear, Int6Linear, Int8Linear, kernel_rule  # noqa: E402
from via_sd.weights.machine import cpu_name  # noqa: E402


def best_of(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class ReadProbe:
    """The kernel module's read probe (bandwidth.cpp: every thread streams its share of a buffer far larger than the
    caches through vector loads, as STREAM's read side), its buffer kept so that it can run again between steps."""

    def __init__(self, size: int = 1 << 30):
        self.kernel = lowbit_kernel.module()
        self.size = size
        self.big = torch.ones(size, dtype=torch.uint8) if self.kernel else None  # written once: its pages exist
        self.wide = self.kernel is not None and lowbit_kernel.isa() == 2

    def gbs(self, repeats: int = 5) -> float | None:
        """GB/s, best of `repeats` reads; None without the kernel."""
        if self.kernel is None:
            return None
        return self.size / best_of(lambda: self.kernel.stream_read(self.big, self.wide), repeats) / 1e9


def dot_peak(rounds: int = 20_000_000) -> float | None:
    """Byte products a second (int8 x uint8 multiply-adds) of the kernel's dot-product instruction on every thread,
    from registers (bandwidth.cpp), best of 5; None without the kernel."""
    kernel = lowbit_kernel.module()
    if kernel is None or lowbit_kernel.isa() == 0:  # the generic path has no vector instruction to probe
        return None
    vnni = lowbit_kernel.isa() == 2
    products = kernel.dot_peak(rounds, vnni)
    return products / best_of(lambda: kernel.dot_peak(rounds, vnni))


def roofline(probe: ReadProbe) -> tuple[list[str], float | None, float | None]:
    bandwidth, peak, size = probe.gbs(), dot_peak(), probe.size
    a = torch.randn(1024, 1024)
    fp32 = 2 * 1024 ** 3 / best_of(lambda: a @ a) / 1e9
    read = f"{bandwidth:.1f} GB/s" if bandwidth else "not measured (no kernel)"
    dots = f"{peak / 1e9:.0f} G products/s" if peak else "not measured (no kernel, or its generic path)"
    isa = f"{lowbit_kernel.ISAS[lowbit_kernel.isa()]}, " if peak else ""  # isa() raises without a kernel
    lines = [f"| memory read, {torch.get_num_threads()} threads (vector loads over {size >> 20} MiB, bandwidth.cpp) | {read} |",
             f"| int8 dot products, {torch.get_num_threads()} threads, from registers ({isa}bandwidth.cpp) | {dots} |",
             f"| fp32 matmul 1024^3 (torch) | {fp32:.0f} GFLOP/s |"]
    if lowbit_kernel.available():
        layer, x = Int4Linear.from_float(torch.randn(1536, 1536) * 0.05), torch.randn(64, 1536)
        ops = 2 * 64 * 1536 * 1536 / best_of(lambda: layer(x)) / 1e9
        lines.append(f"| int4 x int8 kernel, 64 rows on a cache-resident 1536x1536 | {ops:.0f} GOP/s |")
    return ["| limit | measured |", "|---|---|", *lines], bandwidth, peak


def weights_per_row(model) -> int:
    """Weights a row multiplies in one pass of `model`: every low-bit linear's in x out (the head's included)."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, (Int4Linear, Int6Linear, Int8Linear)))


def linear_rows(n: int, k: int, rows: list[int], copies: int = 24) -> list[str]:
    """One n x k int4 linear at each row count, ours against torch's kernel, weights read from memory (`copies`
    layers called in turn, more bytes than the caches hold), best of 3 sweeps."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.05
    kinds = {"ours": [Int4Linear.from_float(w, tiles=True) for _ in range(copies)] if lowbit_kernel.available() else [],
             "torch's": [Int4Linear.from_float(w, tiles=False) for _ in range(copies)]}
    size = sum(t.numel() * t.element_size() for t in (*kinds["torch's"][0].parameters(), *kinds["torch's"][0].buffers()))
    table = [f"| rows | {' | '.join(f'{name} ms (x one row)' for name, layers in kinds.items() if layers)} |",
             "|---|" + "---|" * sum(1 for layers in kinds.values() if layers)]
    one = {}
    for m in rows:
        x, cells = torch.randn(m, k), []
        for name, layers in kinds.items():
            if layers:
                ms = best_of(lambda: [layer(x) for layer in layers], 3) / copies * 1e3
                one.setdefault(name, ms)
                cells.append(f"{ms:.3f} ({ms / one[name]:.2f})")
        table.append(f"| {m} | {' | '.join(cells)} |")
    rates = ", ".join(f"{name} {size / one[name] / 1e6:.1f} GB/s" for name in one)
    return [f"{n}x{k} int4, {size / 1e6:.1f} MB; one row reads at: {rates}", "", *table]


ATTENTION = "attention (norm, rope, cache, fixed-order attention)"  # transformers' forward, torch's kernels
REST = "everything else (embedding, final norm, Python)"
KIND_NAMES = {code: name for name, code in lowbit_kernel.KINDS.items()}


def shape(linears) -> str:
    """"int4+int6 2048x1536": a kernel call's parts' kinds and its whole shape."""
    kinds = "+".join(dict.fromkeys(KIND_NAMES[k] for k in linears.kinds))
    return f"{kinds} {linears.out_features}x{linears.in_features}"


class PartTimer:
    """Exclusive time per part of a step. On the kernel (the lean forward) a sub-layer is one call: each is timed
    whole and named by its linears (what it reads of the weights, and the rate); the head's re-scoring and the rest
    apart. transformers' forward and torch's kernels are timed through their modules."""

    def __init__(self, model, cached, totals: defaultdict | None = None, calls: defaultdict | None = None):
        """Times `model`'s parts until close(), adding to `totals` (seconds) and `calls` (given: kept over timers)."""
        self.totals = defaultdict(float) if totals is None else totals
        self.calls = defaultdict(int) if calls is None else calls
        self.stack, self.bytes = [], {}
        self.hooks = []
        for module in model.modules():
            part = self.part_of(module)
            if part:
                self.hooks += [module.register_forward_pre_hook(lambda m, args, part=part: self.enter(part)),
                               module.register_forward_hook(lambda m, args, out: self.leave())]
        names = ("attention_sublayer", "mlp_sublayer", "tiles_mm")
        self.wrapped = [(lowbit_kernel, name, getattr(lowbit_kernel, name)) for name in names]
        attention, mlp, tiles_mm = (w[2] for w in self.wrapped)
        lowbit_kernel.attention_sublayer = lambda *a: self.timed(attention, self.sublayer("attention", a[3], a[-1]))(*a)
        lowbit_kernel.mlp_sublayer = lambda *a: self.timed(mlp, self.sublayer("MLP", a[3], a[5]))(*a)
        lowbit_kernel.tiles_mm = lambda x, linears, *a, **k: self.timed(tiles_mm, self.sublayer("", linears))(
            x, linears, *a, **k)
        net = getattr(cached, "net", None)
        if net is not None:
            self.wrapped.append((net, "_attend", net._attend))
            net._attend = self.timed(net._attend, ATTENTION)
        self.wrapped.append((cached, "logits", cached.logits))
        cached.logits = self.timed(cached.logits, REST)

    def close(self):
        """Puts back what __init__ wrapped and removes its hooks."""
        for owner, name, original in self.wrapped:
            setattr(owner, name, original)
        for hook in self.hooks:
            hook.remove()

    def sublayer(self, kind: str, *linears) -> str:
        name = f"{kind} sub-layer: {', '.join(shape(group) for group in linears)}" if kind else shape(linears[0])
        self.bytes[name] = sum(group.nbytes for group in linears)
        return name

    def timed(self, method, part):
        def run(*args, **kwargs):
            self.enter(part)
            try:
                return method(*args, **kwargs)
            finally:
                self.leave()
        return run

    def part_of(self, module) -> str | None:
        if isinstance(module, (Int4Linear, Int6Linear, Int8Linear)) and module.layout != "tiles":
            name = f"torch's {'int4' if isinstance(module, Int4Linear) else 'int8'} {module.out_features}x{module.in_features}"
            self.bytes[name] = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
            return name
        if isinstance(module, RescoredHead):
            return "head: exact re-scoring of the best 16"
        if type(module).__name__.endswith("Attention"):
            return ATTENTION
        return None

    def enter(self, part):
        self.stack.append([part, time.perf_counter(), 0.0])

    def leave(self):
        part, start, children = self.stack.pop()
        took = time.perf_counter() - start
        self.totals[part] += took - children
        self.calls[part] += 1
        if self.stack:
            self.stack[-1][2] += took


def step_breakdown(pair, steps: int, probe: ReadProbe, blocks: int = 5) -> tuple[list[str], float]:
    """The step's table, and the bytes of weights a step reads. The steps run in `blocks` blocks, each twice on the
    same tokens: through timing wrappers and hooks for the parts (which cost time of their own), then with nothing
    wrapped for the whole step; the read probe runs before each block and after the last. A shared VM's bandwidth
    moves by half from one minute to the next, so the shares of bandwidth are of the probe's median in the same
    minutes (side by side), not of the roofline's."""
    seq = pair.encode("Write a function that merges two sorted lists, and explain it.")
    cached = model_cache(pair.verifier, pair.vocab_size, "cpu", "cpu")
    start = len(seq)
    for _ in range(steps + 1):  # the tokens the steps read, greedy (the first step's is the prompt read's)
        seq.append(int(cached.logits(seq, len(seq), 1)[-1].argmax()))
    cached.rollback(start + 1)
    totals, calls, reads, timed, total = defaultdict(float), defaultdict(int), [], 0.0, 0.0
    for block in range(blocks):
        reads.append(probe.gbs(2))
        lo, hi = start + 1 + steps * block // blocks, start + 1 + steps * (block + 1) // blocks
        timer = PartTimer(pair.verifier, cached, totals, calls)
        try:
            begin = time.perf_counter()
            for n in range(lo, hi):
                cached.logits(seq, n + 1, 1)
            timed += time.perf_counter() - begin
        finally:
            timer.close()
        cached.rollback(lo)
        begin = time.perf_counter()
        for n in range(lo, hi):
            cached.logits(seq, n + 1, 1)
        total += time.perf_counter() - begin
    reads.append(probe.gbs(2))
    timed, total = timed / steps, total / steps
    bandwidth = statistics.median(reads) if None not in reads else None
    share = (lambda rate: f"{rate / bandwidth:.0%}") if bandwidth else (lambda rate: "")
    rows = ["| part | calls a step | ms a step | share | ms a call | MB a call | GB/s | of bandwidth |",
            "|---|---|---|---|---|---|---|---|"]
    for part, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        per_step, per_call = seconds / steps * 1e3, seconds / calls[part] * 1e3
        size = timer.bytes.get(part)
        rate = size / per_call / 1e6 if size else 0.0
        rows.append(f"| {part} | {calls[part] / steps:g} | {per_step:.2f} | {per_step / (timed * 1e3):.0%} | "
                    f"{per_call:.3f} | {size / 1e6:.2f} | {rate:.1f} | {share(rate)} |" if size else
                    f"| {part} | {calls[part] / steps:g} | {per_step:.2f} | {per_step / (timed * 1e3):.0%} | | | | |")
    kernel_bytes = sum(timer.bytes[p] * calls[p] / steps for p in timer.bytes if p in calls)
    kernel_s = sum(totals[p] for p in timer.bytes if p in totals) / steps
    rows.append(f"| low-bit linears | | {kernel_s * 1e3:.1f} | {kernel_s / timed:.0%} | | {kernel_bytes / 1e6:.0f} | "
                f"{kernel_bytes / kernel_s / 1e9:.1f} | {share(kernel_bytes / kernel_s / 1e9)} |")
    rows.append(f"| **one step** | | **{total * 1e3:.1f}** | 100% | | {kernel_bytes / 1e6:.0f} (weights) | "
                f"{kernel_bytes / total / 1e9:.1f} | {share(kernel_bytes / total / 1e9)} |")
    rows += ["", f"the parts: {steps} steps through timing wrappers and hooks ({timed * 1e3:.1f} ms a step), shares of "
                 f"that; one step: the same steps, block by block, with nothing wrapped"]
    if bandwidth:
        rows += [f"of bandwidth: of the read probe's median, {bandwidth:.1f} GB/s, over {len(reads)} reads before, "
                     f"between and after {blocks} blocks of the steps ({min(reads):.1f}-{max(reads):.1f} GB/s)"]
    return rows, kernel_bytes


def forward_ab(pair, steps: int, blocks: int = 6) -> str:
    """One-token steps of the verifier through the lean forward and through transformers' forward (what the verifier
    ran before), in alternating blocks of `steps` // blocks: the same tokens, a paired ratio."""
    seq = pair.encode("Write a function that merges two sorted lists, and explain it.")
    lean, theirs = (model_cache(pair.verifier, pair.vocab_size, "cpu", "cpu"),
                    CachedModel(pair.verifier, pair.vocab_size, "cpu", "cpu"))
    for model in (lean, theirs):
        model.logits(seq, len(seq), 1)
    seq = seq + [int(t) for t in torch.randint(0, pair.vocab_size, (steps + 1,), generator=torch.Generator().manual_seed(0))]
    spent = {"lean": 0.0, "transformers'": 0.0}
    at = len(seq) - steps
    for block in range(blocks):
        upto = at + steps * (block + 1) // blocks
        for name, model in (("lean", lean), ("transformers'", theirs)):
            start = time.perf_counter()
            for n in range(model.seen + 1, upto + 1):
                model.logits(seq, n, 1)
            spent[name] += time.perf_counter() - start
    a, b = (spent[name] / steps * 1e3 for name in ("lean", "transformers'"))
    return (f"one step, lean forward {a:.1f} ms, transformers' forward {b:.1f} ms: {b - a:.1f} ms less "
            f"({a / b:.2f}x), {steps} steps each in {blocks} alternating blocks")


def verify_curve(pair, context: int, rows: list[int], sweeps: int = 9) -> dict[int, tuple[float, float]]:
    """{k: (verify(k), V(k))} of the pair's verifier after `context` tokens, over `sweeps` sweeps of the row counts:
    verify(k) the median of its passes; V(k) the median of each sweep's verify(k) / verify(first k), passes
    timed seconds apart (the VM's speed moves by a fifth from one minute to the next)."""
    text = "Speculative decoding drafts tokens cheaply and verifies them in one pass of the large model. " * 64
    seq = pair.encode(text, chat=False)[:context + max(rows)]
    times = defaultdict(list)
    cached = model_cache(pair.verifier, pair.vocab_size, "cpu", "cpu")  # as the decoders verify
    cached.logits(seq, context, 1)
    for _ in range(sweeps):
        for k in rows:
            def one_pass():
                cached.logits(seq, context + k, k)
                cached.rollback(context)
            times[k].append(best_of(one_pass, 1))
    return {k: (statistics.median(v), statistics.median(a / b for a, b in zip(v, times[rows[0]])))
            for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="embedded")
    ap.add_argument("--bandwidth-mib", type=int, default=1024, help="buffer read by the bandwidth probe")
    ap.add_argument("--steps", type=int, default=20, help="one-token steps timed")
    ap.add_argument("--context", type=int, default=200, help="tokens cached before a verification pass")
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,12,16", help="pass sizes k for V(k)")
    ap.add_argument("--no-torch", action="store_true", help="skip torch's kernel's V(k) (a second pair load)")
    ap.add_argument("--linear", default="8960x1536", help="one linear NxK timed at every row count ('' to skip)")
    ap.add_argument("--compare-forward", action="store_true",
                    help="also time steps through transformers' forward, alternating with the lean forward's")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{cpu_name()}; ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}\n")
    probe = ReadProbe(args.bandwidth_mib << 20)
    table, bandwidth, peak = roofline(probe)
    print("\n".join(table) + "\n")
    if args.linear:
        print("\n".join(linear_rows(*map(int, args.linear.split("x")), rows)) + "\n")
    pair = load_pair(args.preset, weights="int4")
    print(f"verifier: {pair.verifier_name}; kernel: {kernel_rule(pair.verifier)}\n")
    per_row = weights_per_row(pair.verifier)
    table, step_bytes = step_breakdown(pair, args.steps, probe)
    print("\n".join(table) + "\n")
    if args.compare_forward:
        print(forward_ab(pair, args.steps) + "\n")
    ours = verify_curve(pair, args.context, rows)
    del pair  # one pair at a time: two embedded pairs in one process slowed each pass tenfold here
    gc.collect()
    theirs = None
    if not args.no_torch:
        with lowbit_kernel.off():
            theirs = verify_curve(load_pair(args.preset, weights="int4"), args.context, rows)
    # The roofline of a pass: its weights' bytes at the read bandwidth, its rows' products at the dot-product peak.
    # Below the crossing a pass can cost what one row does (V(k) = 1 with reads and products overlapped); past it
    # the products alone set the least a pass costs.
    if peak and bandwidth:
        row_ms, read_ms = per_row / peak * 1e3, step_bytes / bandwidth / 1e6
        print(f"a row multiplies {per_row / 1e9:.2f} G weights: {row_ms:.2f} ms a row at the dot-product peak; a pass "
              f"reads {step_bytes / 1e6:.0f} MB of weights: {read_ms:.1f} ms at the read bandwidth; the products outweigh "
              f"the reads past k = {read_ms / row_ms:.1f} rows\n")
    print("| k | verify(k), ours | V(k), ours | verify(k), torch's kernel | V(k), torch's |")
    print("|---|---|---|---|---|")
    for k in rows:
        torch_cells = f"{theirs[k][0] * 1e3:.1f} ms | {theirs[k][1]:.2f}" if theirs else "not run | "
        print(f"| {k} | {ours[k][0] * 1e3:.1f} ms | {ours[k][1]:.2f} | {torch_cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
