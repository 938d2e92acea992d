"""The project's own int4 / int8 CPU matmul (lowbit_kernel.cpp), built once per machine through
torch.utils.cpp_extension into the cache, and what runs when it cannot be built.

Activations are quantized to int8 per row and group of 32 and multiplied in integers against the weights, which
are read once per call whatever the number of rows: a pass over 8 rows costs far less than 8 one-row passes, and
one row reads the weights at close to memory speed. The arithmetic is defined once (the .cpp's header) and the
AVX-512 VNNI, AVX2 and generic paths follow it to the bit, so a prompt gives the same numbers on every x86 CPU,
and each row of a call the bits it gets alone. Where the build fails (no compiler, another architecture) or
VIA_SD_KERNEL=torch, the linears keep torch's own int4 / int8 kernels (linears.py), and the trace says so;
VIA_SD_KERNEL=generic|avx2|avx512 runs the kernel on that path (the same bits: how a test sees another CPU).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch
from filelock import FileLock

from .paths import cache_root

SOURCE = Path(__file__).with_name("lowbit_kernel.cpp")
ATTENTION = Path(__file__).with_name("attention.cpp")  # the fixed-order causal attention, in the same module
BANDWIDTH = Path(__file__).with_name("bandwidth.cpp")  # the memory read probe (scripts/kernel_breakdown.py)
HEAD_ROWS = Path(__file__).with_name("head_rows.cpp")  # the head re-scoring's best k and Q6_K rows (heads.py)
ISAS = {0: "generic", 1: "AVX2", 2: "AVX-512 VNNI"}
FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c++17", "-fopenmp"]  # at::parallel_for is OpenMP

log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}
_off: ContextVar[bool] = ContextVar("via_sd_lowbit_off", default=False)


def sources() -> tuple[Path, ...]:
    """The files the module is built from (module globals: a test points them elsewhere)."""
    return SOURCE, ATTENTION, BANDWIDTH, HEAD_ROWS


def build_dir() -> Path:
    """One folder per source, flags and torch version, under the cache."""
    code = b"".join(source.read_bytes() for source in sources())
    key = hashlib.sha256(code + " ".join(FLAGS).encode() + torch.__version__.encode()).hexdigest()[:12]
    return cache_root() / "kernels" / key


def _build():
    from torch.utils import cpp_extension

    folder = build_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.parent / "build.lock"):  # processes building at once wait for the first
        for old in folder.parent.iterdir():  # one build kept: older sources' and torch versions' go
            if old.is_dir() and old != folder:
                shutil.rmtree(old, ignore_errors=True)
                log.info("removed the old kernel build %s", old)
        folder.mkdir(exist_ok=True)
        baton = folder / "lock"  # torch's own build lock: under ours, only a build killed midway leaves it
        if baton.exists():
            baton.unlink()
            log.warning("removed a stale build lock %s, left by a build that was stopped midway", baton)
        return cpp_extension.load(name=f"via_sd_lowbit_{folder.name}", sources=[str(source) for source in sources()],
                                  extra_cflags=FLAGS,
                                  extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)


def _failure(error: Exception) -> str:
    """Why the build failed, in one line: the compiler's first error, else the exception's last line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    first = next((line for line in lines if "error:" in line or "not found" in line), lines[-1])  # gcc, ninja, sh
    log.warning("the low-bit kernel did not build: %s\n%s", first, error)  # the full output, for whoever fixes it
    return (f"the kernel did not build ({first[:400]}); torch's kernels compute other bits, so tokens differ from "
            "the kernel's")


def module():
    """The built extension, or None (and `why_not()` says why)."""
    with _lock:
        if "module" not in _state:
            _state["module"], _state["why"], _state["error"] = None, None, None
            if os.environ.get("VIA_SD_KERNEL", "") == "torch":
                _state["why"] = "VIA_SD_KERNEL=torch"
            elif platform.machine().lower() not in ("x86_64", "amd64"):
                _state["why"] = f"not an x86 CPU ({platform.machine()})"
            else:
                try:
                    kernel = _build()
                except Exception as error:  # no compiler, no ninja, a read-only cache: torch's kernels serve
                    _state["why"] = _state["error"] = _failure(error)
                else:
                    # the CPU's own instructions: ATen's capability follows ATEN_CPU_CAPABILITY, a user's pin
                    if kernel.best_isa() == 0:
                        _state["why"] = "this x86 CPU has no AVX2 + FMA"
                    else:
                        _state["module"], _state["isa"] = kernel, _path(kernel.best_isa())  # asked once: every matmul
        return _state["module"]


def _path(best: int) -> int:
    """The path every call runs: the CPU's best, or a narrower one named by VIA_SD_KERNEL=generic|avx2|avx512 (the
    same bits by construction; tests force each)."""
    forced = {"generic": 0, "avx2": 1, "avx512": 2}.get(os.environ.get("VIA_SD_KERNEL", ""), best)
    return min(forced, best)


def build_error() -> str | None:
    """Why the kernel failed to build (its compiler's first error), or None when it built or was not tried."""
    module()
    return _state["error"]


def available() -> bool:
    return module() is not None and not _off.get()


@contextmanager
def off():
    """Layers built inside take torch's kernels, and the head's re-scoring runs its ATen / numpy path (the same
    values: head_rows.cpp) while inside (for side-by-side measurements and tests)."""
    token = _off.set(True)
    try:
        yield
    finally:
        _off.reset(token)


def why_not() -> str | None:
    module()
    return "switched off (lowbit_kernel.off)" if _state["module"] is not None and _off.get() else _state["why"]


def isa() -> int:
    """The widest instruction set this CPU runs the kernel with (all give the same bits)."""
    module()  # the module, even while off(): layers built before still run it
    return _state["isa"]


def _loaded():
    """The built module without taking the lock (a matmul's path: the module is there once a layer uses it)."""
    return _state["module"] if "module" in _state else module()


_NONE = torch.empty(0)  # "no bias", "no residual" to the kernel
KINDS = {"int4": 4, "int6": 6, "int8": 8}


def parts(layers):
    """`layers` (linears.py's layers whose `kernel_kind` is set, one input width) as the kernel's one-call handle,
    biases included (lowbit_kernel.cpp's Linears): built once, passed to tiles_mm and the sub-layer calls."""
    kinds, codes, scales, biases = [], [], [], []
    for layer in layers:
        kind = layer.kernel_kind
        if kind is None:
            raise ValueError(f"{type(layer).__name__} does not run on the project's kernel in tiles")
        kinds.append(KINDS[kind])
        codes.append(layer.packed if kind == "int4" else layer.weight)
        scales.append(layer.scale if kind == "int8" else layer.scales)
        biases.append(_NONE if layer.bias is None else layer.bias.detach())
    return _loaded().Linears(kinds, codes, scales, biases)


def tiles_mm(x: torch.Tensor, linears, residual: torch.Tensor | None = None, path: int | None = None) -> torch.Tensor:
    """x float32 [M, K] @ [W_0; W_1; ...].T, each part plus its bias, then plus `residual` [M, N] (the same bits
    as torch adding them after): the layers of `parts(layers)`, side by side, in one call."""
    return _loaded().tiles_mm(x, linears, _NONE if residual is None else residual,
                              _state["isa"] if path is None else path)


def int4_mm(x: torch.Tensor, codes: torch.Tensor, sm: torch.Tensor, path: int | None = None) -> torch.Tensor:
    """x float32 [M, K] @ W.T, W int4 in the kernel's layout (`codes` uint8 [N/16, K/32, 256], `sm` uint8
    [N/16, ceil(K/256), 256]: Q4_K's super-blocks, fp16 d and dm and 6-bit sub-scales and mins)."""
    return tiles_mm(x, _loaded().Linears([4], [codes], [sm], [_NONE]), None, path)


def int6_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, path: int | None = None) -> torch.Tensor:
    """x float32 [M, K] @ W.T, W Q6_K in the kernel's layout (`codes` uint8 [N/16, K/32, 384], `scales` uint8
    [N/16, K/256, 288]: fp16 d and int8 sub-scales per 16 inputs)."""
    return tiles_mm(x, _loaded().Linears([6], [codes], [scales], [_NONE]), None, path)


def int8_mm(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, path: int | None = None) -> torch.Tensor:
    """x float32 [M, K] @ W.T, W int8 per channel (`codes` uint8 [N/16, K/32, 512] holding w + 128, `scale` fp32
    [N])."""
    return tiles_mm(x, _loaded().Linears([8], [codes], [scale], [_NONE]), None, path)


def rope_attention(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   start: int, heads: int, scale: float) -> torch.Tensor:
    """A sub-layer's attention after its q/k/v matmul (attention.cpp): y [R, (heads + 2 kv_heads) D] rotated by
    cos, sin (sin's first half negated) [R, D], k and v written into the cache buffers at rows start.., the causal
    attention [1, R, heads, D]; the bits of the same steps in torch."""
    return _loaded().rope_attention(y, cos, sin, keys, values, start, heads, scale, _state["isa"])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch.rms_norm(x, weight.shape, weight, eps)'s bits in one call (x contiguous float32 [..., H])."""
    return _loaded().rms_norm(x, weight, eps)


def attention_sublayer(h, norm, eps, qkv, cos, sin, keys, values, start, heads, scale, o) -> torch.Tensor:
    """h + o(attention(rope(qkv(rms_norm(h))))) in one call: the lean forward's attention sub-layer, its bits."""
    return _loaded().attention_sublayer(h, norm, eps, qkv, cos, sin, keys, values, start, heads, scale, o, _state["isa"])


def mlp_sublayer(h, norm, eps, gate_up, inner, down) -> torch.Tensor:
    """h + down(silu(gate) * up) over rms_norm(h) in one call: the lean forward's MLP sub-layer, its bits."""
    return _loaded().mlp_sublayer(h, norm, eps, gate_up, inner, down, _state["isa"])


def has_attention() -> bool:
    """Is the fixed-order attention (attention.cpp) loaded? (Not switched by off(): it changes no layer.)"""
    return _state.get("module") is not None


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q [B, H, R, D] over k, v [B, KH, T, D] (row i sees keys 0 .. T - R + i), in one fixed
    order of arithmetic; [B, R, H, D]. Its AVX-512, AVX2 and generic paths give the same bits."""
    return _loaded().causal_attention(q, k, v, scale, _state["isa"])
