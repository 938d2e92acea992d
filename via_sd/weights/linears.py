"""The int4 and int8 linears on torch's CPU kernels, and the nibble layouts they read.

`Int4Linear`: group-wise int4 weights (groups of 32 along the input dimension,
w = (q - 8) * scale + zero, gpt-fast's layout), run by `_weight_int4pack_mm_for_cpu` on bf16
activations; every output row and column is computed on its own, so stacking output features (fused.py)
or rows changes no bit. Every pass, of any row count, takes that kernel: the path is a rule fixed in code
(`KERNEL_RULE`), never a timing, so a prompt gives the same numbers on every machine with the same torch and
CPU capability. `Int8Linear`: per-channel int8 for the tensors a GGUF keeps at 5-8 bits.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32
BLOCK_N = 64       # rows per block of the CPU packed layout (checked by _layout_ok)
# Which path a low-bit pass takes, recorded in every trace (models.describe). A de-quantize + bf16 matmul path for
# long prompt reads, chosen by a timing at set-up, once made a prompt's numbers depend on the machine; measured
# side by side it was slower than the kernel on both CPU kinds these machines have (BENCHMARKS.md), so it is gone.
KERNEL_RULE = "torch int4/int8 weight-only kernels at every row count"


def kernel_rule() -> str:
    """The kernel rule and what its numbers depend on: torch's version and the CPU capability it dispatches to."""
    return f"{KERNEL_RULE} (torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()})"


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_shape_ok(out_features: int, in_features: int) -> bool:
    """What torch's CPU int4 kernel takes: rows a multiple of 16, columns of the group size."""
    return out_features % 16 == 0 and in_features % GROUP == 0


def quantize_int4(w: torch.Tensor, group: int = GROUP):
    """Float [N, K] -> (codes uint8 0..15, scale, zero) per group of `group` columns, asymmetric
    min/max as gpt-fast: w ~= (q - 8) * scale + zero."""
    n, k = w.shape
    g = w.reshape(n, k // group, group).float()
    lo, hi = torch.aminmax(g, dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    g = (g - lo[..., None]).mul_((1 / scale)[..., None]).round_().clamp_(0, 15)  # one copy, then in place
    return g.to(torch.uint8).reshape(n, k), scale, lo + 8 * scale


def pack_nibbles(codes):
    """4-bit codes [..., K] -> two a byte [..., K / 2], low nibble = even column (the codes cache's
    layout; works on torch tensors and numpy arrays of uint8)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_nibbles."""
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2)


_LAYOUT_OK = None


def _unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The CPU packed layout back to codes [n, k]: blocks of 64 rows; per column 32 bytes whose low
    nibbles are rows 0..31 and high nibbles rows 32..63 of the block (as AVX2/AVX512 builds pack)."""
    b = packed.view(n // BLOCK_N, k, BLOCK_N // 2)
    return torch.cat([b & 15, b >> 4], -1).permute(0, 2, 1).reshape(n, k)


def _layout_ok() -> bool:
    """Does this build pack the way _unpack reads? (Checked once; if not, no de-quantize path.)"""
    global _LAYOUT_OK
    if _LAYOUT_OK is None:
        q = torch.randint(0, 16, (2 * BLOCK_N, 2 * GROUP), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        _LAYOUT_OK = packed.shape == (2 * BLOCK_N, GROUP) and torch.equal(_unpack(packed, *q.shape).int(), q)
    return _LAYOUT_OK


def _pack(q: torch.Tensor) -> torch.Tensor:
    """Codes [n, k] (0..15) -> the kernel's packed layout; byte shuffling when the layout is the one
    _unpack reads (no int32 copy), else torch's own packing."""
    n, k = q.shape
    if n % BLOCK_N == 0 and _layout_ok():
        b = q.to(torch.uint8).view(n // BLOCK_N, 2, BLOCK_N // 2, k)
        return (b[:, 0] | (b[:, 1] << 4)).transpose(1, 2).contiguous().view(n, k // 2)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)


class Int4Linear(nn.Module):
    """y = x @ W.T + b with W held as group-wise int4 in the layout of torch's CPU int4 kernel, which computes
    every row on its own: a pass over k rows gives each row the bits a one-row pass gives it."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, bias=None, group: int = GROUP):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = scales_and_zeros.shape[0] * group, scales_and_zeros.shape[1]
        # a (uint8) parameter, not a buffer, so code that counts or collects a model's parameters
        # (route costs, the slim verifier's weight set) still sees the weights; one element = 2 weights
        self.packed = nn.Parameter(packed, requires_grad=False)
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [K / group, N, 2], the kernel's layout
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def from_codes(cls, chunks, bias=None) -> "Int4Linear":
        """From (codes 0..15 [n, K], scale [n, K/32], zero [n, K/32]) row chunks (multiples of 64 rows
        but the last), packed chunk by chunk so no int32 copy of a large weight ever exists."""
        packed, sz = [], []
        for q, scale, zero in chunks:
            if not int4_shape_ok(*q.shape):
                raise ValueError(f"the int4 kernel cannot take a {q.shape[0]}x{q.shape[1]} weight")
            packed.append(_pack(q))
            sz.append(torch.stack([scale.float(), zero.float()], -1).transpose(0, 1).to(torch.bfloat16))
        return cls(torch.cat(packed, 0), torch.cat(sz, 1).contiguous(), bias)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias=None, rows: int = 4096) -> "Int4Linear":
        """Quantizes a float [N, K] weight group-wise (min / max per group of 32)."""
        weight = weight.detach()
        return cls.from_codes((quantize_int4(weight[i:i + rows]) for i in range(0, weight.shape[0], rows)), bias)

    @classmethod
    def stacked(cls, parts: list["Int4Linear"]) -> "Int4Linear":
        """One layer whose output features are the parts' outputs side by side (fused q/k/v, gate/up):
        the packed blocks of 64 rows and their scales are concatenated as they are, nothing re-quantized."""
        if not all(p.out_features % BLOCK_N == 0 and p.in_features == parts[0].in_features for p in parts) \
                or not _layout_ok():
            raise ValueError("only layers of whole 64-row blocks over one input width can be stacked")
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        bias = torch.cat(biases) if any(p.bias is not None for p in parts) else None
        return cls(torch.cat([p.packed for p in parts]), torch.cat([p.scales_and_zeros for p in parts], 1), bias,
                   parts[0].group)

    def select_rows(self, ids: torch.Tensor) -> "Int4Linear":
        """A layer of only the output features `ids` (a multiple of 16 of them), same codes and scales."""
        n, k = self.out_features, self.in_features
        if n % BLOCK_N or not _layout_ok() or len(ids) % 16:
            raise ValueError(f"cannot select {len(ids)} of the rows of a {n}x{k} int4 layer")
        blocks = torch.unique(ids // BLOCK_N)
        chosen = self.packed.view(n // BLOCK_N, k * BLOCK_N // 2)[blocks].view(-1, k // 2)  # whole 64-row blocks
        codes = _unpack(chosen, len(blocks) * BLOCK_N, k)
        where = torch.searchsorted(blocks, ids // BLOCK_N) * BLOCK_N + ids % BLOCK_N
        sz = self.scales_and_zeros[:, ids]
        bias = None if self.bias is None else self.bias[ids]
        return type(self)(_pack(codes[where]), sz.contiguous(), bias, self.group)

    @property
    def weight(self) -> torch.Tensor:
        """The packed codes (callers read .device / .dtype off a module's `weight`)."""
        return self.packed

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K], what the kernel multiplies by (bf16 scales and zeros)."""
        n, k = self.out_features, self.in_features
        q = _unpack(self.packed, n, k).float().view(n, k // self.group, self.group)
        sz = self.scales_and_zeros.float().transpose(0, 1)  # [N, K / group, 2]
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_and_zeros).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}"


def int8_shape_ok(out_features: int, in_features: int) -> bool:
    """What torch's CPU int8 kernel takes safely (it crashes or returns garbage for some other widths)."""
    return in_features % GROUP == 0


class Int8Linear(nn.Module):
    """y = x @ W.T + b with W as int8 per output channel (scale = max |row| / 127), run by torch's CPU
    kernel `_weight_int8pack_mm` (bf16 activations in). For the tensors a GGUF keeps at 5 to 8 bits:
    re-quantizing those to int4 changed the verifier's top-1 where the int4 tensors did not, and the
    int8 kernel is as fast as the int4 one on these shapes (BENCHMARKS.md)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias=None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)  # int8 [N, K]
        self.register_buffer("scale", scale.to(torch.bfloat16))  # [N], the kernel takes the activations' dtype
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def from_float(cls, chunks, bias=None) -> "Int8Linear":
        """From float [n, K] row chunks, quantized one chunk at a time."""
        codes, scales = [], []
        for w in chunks:
            scale = w.abs().amax(1).clamp(min=1e-12) / 127
            codes.append((w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8))
            scales.append(scale)
        return cls(torch.cat(codes), torch.cat(scales), bias)

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K], what the kernel multiplies by."""
        return self.weight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).to(torch.bfloat16), self.weight,
                                                self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"
