"""Which int4 path a pass over many rows takes: the kernel, or de-quantize once + bf16 matmuls.

Measured once per weight shape and machine (`measure_dense_from`), kept in <cache>/lowbit-kernels.json
under a key naming torch, the CPU capability and the thread count, and from then on only read: a
shape's rule, once set in a process, never changes in it (`remeasure` writes the table for the next
process). So the path depends only on the rows of a pass and a threshold fixed for the process, and
the dense path is never taken by a pass that extends a cache (int4.Int4Linear): AR and SD read a
prompt the same way and verify with the same kernel, whatever the clock said at measuring time.
"""

from __future__ import annotations

import json
import time

import torch
from torch import nn

from .int4 import Int4Linear

ROWS = (32, 128, 512)  # the row counts a shape is measured at; its threshold is one of them or None
_FIXED: dict[str, int | None] = {}  # shape -> dense_from, decided once per process


def kernel_table_path():
    from .paths import cache_root

    return cache_root() / "lowbit-kernels.json"


def machine_key() -> str:
    return f"torch {torch.__version__} / {torch.backends.cpu.get_cpu_capability()} / {torch.get_num_threads()} threads"


def _best_of(fn, repeat: int = 2) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_dense_from(layer: Int4Linear, rows=ROWS) -> int | None:
    """The fewest rows (of `rows`) at which de-quantize + bf16 matmul beat the int4 kernel, or None."""
    if not layer.can_dequantize():
        return None
    saved, gen = layer.dense_from, torch.Generator().manual_seed(0)
    try:
        with torch.inference_mode():
            for m in rows:
                x = torch.randn(m, layer.in_features, generator=gen)
                layer.dense_from = None
                kernel = _best_of(lambda: layer(x))
                layer.dense_from = 1
                dense = _best_of(lambda: layer(x))
                if dense < 0.9 * kernel:  # a clear win only: timings on a shared machine are noisy
                    return m
        return None
    finally:
        layer.dense_from = saved


def _read_table(path) -> dict:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def choose_kernels(model: nn.Module, remeasure: bool = False) -> dict:
    """Sets `dense_from` on every Int4Linear: this process's rule for its shape if one was set, else the
    machine's table, else a measurement (written to the table). Returns {shape: dense_from}."""
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if not layers:
        return {}
    path, key = kernel_table_path(), machine_key()
    table = _read_table(path)
    known = table.get(key) if isinstance(table.get(key), dict) else {}
    table[key] = known
    changed = False
    for layer in layers:
        shape = f"{layer.out_features}x{layer.in_features}"
        value = known.get(shape, "missing")
        if remeasure or value == "missing" or not (value is None or value in ROWS):
            known[shape] = value = measure_dense_from(layer)
            changed = True
        layer.dense_from = _FIXED.setdefault(shape, value)  # the first rule this process set stays
    if changed:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache: measure again next time
    return {f"{m.out_features}x{m.in_features}": m.dense_from for m in layers}
