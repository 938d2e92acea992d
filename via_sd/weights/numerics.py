"""One code path for torch's CPU kernels on every x86-64 machine, so a prompt gives the same bits on Intel and AMD.

A forward's numbers depend on three libraries' choices of code: ATen's vectorized ops (norms, rotary, SiLU,
softmax) dispatch on the CPU's capability (AVX2 or AVX-512: 8 or 16 lanes, another order of summation); MKL's
sgemm on vendor and instruction set; oneDNN on its ISA. Our forwards call neither MKL nor oneDNN (the linears
and the attention run in the project's kernel: lowbit_kernel.cpp, attention.cpp), and ATen is pinned here to
its AVX2 code, which is the same instructions on every x86-64 CPU with AVX2: the floor of the promise (an older
or non-x86 CPU runs ATen's generic code and torch's kernels, with other bits). tests/test_code_paths.py forces
every other path this machine can take and finds the same bits.

`pin()` runs when `via_sd` is imported, before anything of ours loads torch. ATen reads the variable on its first
operation, not on import, so importing torch first is fine; running a torch op first is not, and is refused.
"""

from __future__ import annotations

import os
import sys

ATEN_PATH = "avx2"


class CodePathError(RuntimeError):
    """torch already chose another code path in this process."""


def pin() -> None:
    """Sets ATen's code path for this process (and its children) before torch's first CPU operation.
    VIA_SD_ATEN=native leaves ATen its own choice: only to measure what the pin costs (benchmarks/code_path_cost.py);
    the numbers then depend on the machine."""
    if os.environ.get("VIA_SD_ATEN") == "native":
        return
    os.environ["ATEN_CPU_CAPABILITY"] = ATEN_PATH
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "backends"):  # not loaded yet (or still loading): it reads the variable
        return
    chosen = torch.backends.cpu.get_cpu_capability()
    if chosen != "AVX2" and has_avx2():  # a CPU without AVX2 (or not x86) never had the choice
        raise CodePathError(
            f"torch already ran CPU operations with ATen's {chosen} code path, so this process would compute other "
            f"bits than every other machine: import via_sd before running any torch operation, or start Python "
            f"with ATEN_CPU_CAPABILITY={ATEN_PATH}")


def has_avx2() -> bool:
    """Does this CPU run ATen's AVX2 code (AVX2 and FMA; read from the CPU, not from torch's pinned choice)?"""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False  # not Linux on x86: torch's own choice stands
    return "avx2" in flags and "fma" in flags

