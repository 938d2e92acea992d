"""The int4 and int8 linears, and the nibble layouts their kernels read.

Every low-bit pass, of any row count, takes one kernel, chosen once per process (`KERNEL_RULE`): the project's own
(lowbit_kernel.cpp: activations quantized to int8 per row and group of 32, integer dot products, the same bits on
every x86 path, weights read once per call whatever the rows) where it builds, else torch's
`_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm` on bf16 activations. Either computes every output row and
column on its own, so stacking output features (fused.py) or rows changes no bit: greedy SD equals greedy AR.
`Int4Linear`: group-wise int4 weights (groups of 32 along the input dimension, w = q * scale + offset, scale and
offset on Q4_K's grid: fp16 d and dmin per 256 weights times 6-bit integers per 32).
`Int6Linear`: a GGUF's Q6_K tensors as they are (the project's kernel only).
`Int8Linear`: per-channel int8 for the tensors a GGUF keeps at 5-8 bits otherwise. Each holds its weights in the layout of
the kernel in use ("tiles" for ours, "torch" for torch's).
"""

from __future__ import annotations

import torch
from torch import nn

from . import lowbit_kernel
from .tiles import GROUP, TILE, pack_int4, pack_int6, quantize_int4, unpack_int4, unpack_int6  # noqa: F401

BLOCK_N = 64       # layers of whole 64-row blocks take torch's CPU packing (blocks of 64 or 32 rows: _torch_block)
# Which path a low-bit pass takes, recorded in every trace (models.describe). Never a timing: a path chosen by a
# timing at set-up once made a prompt's numbers depend on the machine.
KERNEL_RULE = "one low-bit kernel at every row count, chosen at load: the project's where it builds, else torch's"


def use_tiles() -> bool:
    """Do new low-bit layers take the project's kernel (its "tiles" layout)?"""
    return lowbit_kernel.available()


def kernel_rule(model: nn.Module | None = None) -> str:
    """The kernel in use (by `model`'s low-bit layers, else by layers built now) and what its numbers depend on
    (torch's kernels: torch's version and the CPU capability)."""
    layouts = {m.layout for m in model.modules() if hasattr(m, "layout")} if model is not None else set()
    if "tiles" in layouts or (not layouts and use_tiles()):
        isa, aten = lowbit_kernel.ISAS[lowbit_kernel.isa()], torch.backends.cpu.get_cpu_capability()
        return f"via_sd q8-activation int4/int8 kernel and fixed-order attention, {isa}; ATen {aten} " \
               "(same bits on every x86-64 with AVX2)"
    why = lowbit_kernel.why_not() or "layers built with lowbit_kernel.off()"
    return f"torch's int4/int8 kernels ({why}; torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()})"


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def int4_shape_ok(out_features: int, in_features: int) -> bool:
    """What torch's CPU int4 kernel takes: rows a multiple of 16, columns of the group size."""
    return out_features % 16 == 0 and in_features % GROUP == 0


def pack_nibbles(codes):
    """4-bit codes [..., K] -> two a byte [..., K / 2], low nibble = even column (the codes cache's
    layout; works on torch tensors and numpy arrays of uint8)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_nibbles."""
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2)


_TORCH_BLOCK = None


def _unpack(packed: torch.Tensor, n: int, k: int, block: int | None = None) -> torch.Tensor:
    """The CPU packed layout back to codes [n, k]: blocks of `block` rows (torch's, by default); per column
    block / 2 bytes whose low nibbles are the block's first half of rows and high nibbles its second half."""
    block = block or _torch_block() or BLOCK_N
    b = packed.view(n // block, k, block // 2)
    return torch.cat([b & 15, b >> 4], -1).permute(0, 2, 1).reshape(n, k)


def _torch_block() -> int | None:
    """Rows per block of torch's CPU int4 packing, which follows ATen's code path (64 rows with its AVX-512 code,
    32 with the AVX2 code numerics.py pins): probed once; None where neither reads back (no de-quantize path)."""
    global _TORCH_BLOCK
    if _TORCH_BLOCK is None:
        q = torch.randint(0, 16, (2 * BLOCK_N, 2 * GROUP), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        _TORCH_BLOCK = next((b for b in (64, 32) if packed.shape == (2 * BLOCK_N, GROUP)
                             and torch.equal(_unpack(packed, *q.shape, b).int(), q)), 0)
    return _TORCH_BLOCK or None


def _layout_ok() -> bool:
    """Does this build pack the way _unpack reads?"""
    return _torch_block() is not None


def _pack(q: torch.Tensor) -> torch.Tensor:
    """Codes [n, k] (0..15) -> the kernel's packed layout; byte shuffling when the layout is the one
    _unpack reads (no int32 copy), else torch's own packing."""
    n, k = q.shape
    if n % BLOCK_N == 0 and _layout_ok():
        block = _torch_block()
        b = q.to(torch.uint8).view(n // block, 2, block // 2, k)
        return (b[:, 0] | (b[:, 1] << 4)).transpose(1, 2).contiguous().view(n, k // 2)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)


class Int4Linear(nn.Module):
    """y = x @ W.T + b with W held as group-wise int4 in the layout of the kernel in use (`layout`), which computes
    every row on its own: a pass over k rows gives each row the bits a one-row pass gives it."""

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, bias=None, group: int = GROUP):
        super().__init__()
        self.group = group
        self.layout = "tiles" if packed.dim() == 3 else "torch"
        if self.layout == "tiles":  # codes [N / 16, K / 32, 256], scales uint8 [N / 16, ceil(K / 256), 256]
            self.in_features, self.out_features = packed.shape[1] * group, packed.shape[0] * TILE
        else:  # torch's: scales_and_zeros [K / group, N, 2]
            self.in_features, self.out_features = scales.shape[0] * group, scales.shape[1]
        # a (uint8) parameter, not a buffer, so code that counts or collects a model's parameters
        # (route costs, the slim verifier's weight set) still sees the weights; one element = 2 weights
        self.packed = nn.Parameter(packed, requires_grad=False)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def from_codes(cls, chunks, bias=None, tiles: bool | None = None) -> "Int4Linear":
        """From (codes 0..15 [n, K], scale [n, K/32], offset [n, K/32]) row chunks, w = q * scale + offset
        (multiples of 64 rows but the last), packed chunk by chunk so no int32 copy of a large weight ever exists.
        The project's layout holds Q4_K's scales and offsets exactly (the GGUF's, or quantize_int4's); torch's
        rounds them to bf16."""
        tiles = use_tiles() if tiles is None else tiles
        packed, scales = [], []
        for q, scale, offset in chunks:
            if not int4_shape_ok(*q.shape):
                raise ValueError(f"the int4 kernel cannot take a {q.shape[0]}x{q.shape[1]} weight")
            if tiles:
                codes, blocks = pack_int4(q, scale, offset)
                packed.append(codes)
                scales.append(blocks)
            else:
                zero = offset.float() + 8 * scale.float()
                packed.append(_pack(q))
                scales.append(torch.stack([scale.float(), zero], -1).transpose(0, 1).to(torch.bfloat16))
        return cls(torch.cat(packed, 0), torch.cat(scales, 0 if tiles else 1).contiguous(), bias)

    @classmethod
    def from_tiles(cls, chunks, bias=None) -> "Int4Linear":
        """From row chunks already in the project's layout: (codes, super-blocks) as tiles.pack_int4 makes them."""
        chunks = list(chunks)
        return cls(torch.cat([c for c, _ in chunks]), torch.cat([s for _, s in chunks]).contiguous(), bias)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias=None, rows: int = 4096, tiles: bool | None = None) -> "Int4Linear":
        """Quantizes a float [N, K] weight group-wise (quantize_int4: min / max per group of 32, as Q4_K)."""
        weight = weight.detach()
        chunks = (quantize_int4(weight[i:i + rows]) for i in range(0, weight.shape[0], rows))
        return cls.from_codes(chunks, bias, tiles)

    @classmethod
    def stacked(cls, parts: list["Int4Linear"]) -> "Int4Linear":
        """One layer whose output features are the parts' outputs side by side (fused q/k/v, gate/up):
        the packed tiles (or blocks of 64 rows) and their scales are concatenated as they are, nothing re-quantized."""
        tiles = all(p.layout == "tiles" for p in parts)
        if not all(p.out_features % BLOCK_N == 0 and p.in_features == parts[0].in_features for p in parts) \
                or not (tiles or (_layout_ok() and all(p.layout == "torch" for p in parts))):
            raise ValueError("only layers of whole 64-row blocks over one input width, in one layout, can be stacked")
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        bias = torch.cat(biases) if any(p.bias is not None for p in parts) else None
        return cls(torch.cat([p.packed for p in parts]), torch.cat([p.scales for p in parts], 0 if tiles else 1),
                   bias, parts[0].group)

    def select_rows(self, ids: torch.Tensor) -> "Int4Linear":
        """A layer of only the output features `ids` (a multiple of 16 of them), same codes and scales."""
        n, k = self.out_features, self.in_features
        if len(ids) % 16 or (self.layout == "torch" and (n % BLOCK_N or not _layout_ok())):
            raise ValueError(f"cannot select {len(ids)} of the rows of a {n}x{k} int4 layer")
        if self.layout == "tiles":
            t = torch.unique(ids // TILE)  # only the tiles that hold a chosen row are unpacked
            q, s, m = unpack_int4(self.packed[t], self.scales[t])
            where = torch.searchsorted(t, ids // TILE) * TILE + ids % TILE
            packed, sm = pack_int4(q[where], s[where], m[where])
            bias = None if self.bias is None else self.bias[ids]
            return type(self)(packed, sm, bias, self.group)
        block = _torch_block()
        blocks = torch.unique(ids // block)
        chosen = self.packed.view(n // block, k * block // 2)[blocks].view(-1, k // 2)  # whole blocks of torch's
        codes = _unpack(chosen, len(blocks) * block, k)
        where = torch.searchsorted(blocks, ids // block) * block + ids % block
        sz = self.scales[:, ids]
        bias = None if self.bias is None else self.bias[ids]
        return type(self)(_pack(codes[where]), sz.contiguous(), bias, self.group)

    @property
    def weight(self) -> torch.Tensor:
        """The packed codes (callers read .device / .dtype off a module's `weight`)."""
        return self.packed

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K], what the kernel multiplies by (the project's layout: Q4_K's exact values; torch's:
        bf16 scales and zeros)."""
        n, k = self.out_features, self.in_features
        if self.layout == "tiles":
            q, s, m = unpack_int4(self.packed, self.scales)
            return (q.float().view(n, -1, self.group) * s[..., None] + m[..., None]).view(n, k)
        q = _unpack(self.packed, n, k).float().view(n, k // self.group, self.group)
        sz = self.scales.float().transpose(0, 1)  # [N, K / group, 2]
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.layout == "tiles":  # the bias added in the kernel: the bits of `y + self.bias`
            y = lowbit_kernel.tiles_mm(x.reshape(-1, self.in_features).float().contiguous(), lowbit_kernel.parts([self]))
            return y.view(*shape[:-1], self.out_features)
        x = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features)

    @property
    def kernel_kind(self) -> str | None:
        """"int4" where the project's kernel runs this layer (lowbit_kernel.parts), else None."""
        return "int4" if self.layout == "tiles" else None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, {self.layout}"


class Int6Linear(nn.Module):
    """y = x @ W.T + b with W a GGUF's Q6_K tensor held exactly (tiles.pack_int6: 6-bit codes, an int8 scale per 16
    inputs, an fp16 one per 256), run by the project's kernel: the verifier's tensors the GGUF keeps at 6 bits, at
    the file's size and values (per-channel int8 re-quantization moved the verifier's top-1)."""

    layout = "tiles"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias=None):
        super().__init__()
        self.in_features, self.out_features = codes.shape[1] * GROUP, codes.shape[0] * TILE
        self.weight = nn.Parameter(codes, requires_grad=False)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @staticmethod
    def shape_ok(out_features: int, in_features: int) -> bool:
        return out_features % TILE == 0 and in_features % 256 == 0

    @classmethod
    def from_codes(cls, chunks, bias=None) -> "Int6Linear":
        """From (Q6_K codes 0..63 [n, K], scales [n, K / 16]) row chunks (multiples of 16 rows), w = (q - 32) s."""
        return cls.from_tiles((pack_int6(q, scale) for q, scale in chunks), bias)

    @classmethod
    def from_tiles(cls, chunks, bias=None) -> "Int6Linear":
        """From row chunks already in the layout: (codes, super-blocks) as tiles.pack_int6 makes them."""
        chunks = list(chunks)
        return cls(torch.cat([c for c, _ in chunks]), torch.cat([s for _, s in chunks]), bias)

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K]: the gguf package's de-quantized values."""
        q, scale = unpack_int6(self.weight, self.scales)
        n, k = self.out_features, self.in_features
        return ((q.float() - 32).view(n, -1, 16) * scale[..., None]).view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = lowbit_kernel.tiles_mm(x.reshape(-1, self.in_features).float().contiguous(), lowbit_kernel.parts([self]))
        return y.view(*shape[:-1], self.out_features)  # the bias added in the kernel: the bits of `y + self.bias`

    kernel_kind = "int6"

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q6_K, tiles"


def int8_shape_ok(out_features: int, in_features: int) -> bool:
    """What torch's CPU int8 kernel takes safely (it crashes or returns garbage for some other widths)."""
    return in_features % GROUP == 0


class Int8Linear(nn.Module):
    """y = x @ W.T + b with W as int8 per output channel (scale = max |row| / 127), for the tensors a GGUF keeps at 5
    to 8 bits: re-quantizing those to int4 changed the verifier's top-1 where the int4 tensors did not. Run by the
    project's kernel (codes w + 128 in tiles of 16 outputs, padded; fp32 scales) or torch's `_weight_int8pack_mm`
    (int8 [N, K], bf16 scales and activations)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias=None, tiles: bool | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.layout = "tiles" if (use_tiles() if tiles is None else tiles) else "torch"
        if self.layout == "tiles":
            n, k = weight.shape
            pad = -n % TILE
            w = torch.cat([weight, weight.new_zeros(pad, k)]) if pad else weight
            weight = (w.to(torch.int16) + 128).to(torch.uint8).view(-1, TILE, k // GROUP, 8, 4) \
                .permute(0, 2, 3, 1, 4).reshape(-1, k // GROUP, 512).contiguous()
            scale = torch.cat([scale.float(), scale.new_zeros(pad, dtype=torch.float32)]).contiguous()
        else:
            scale = scale.to(torch.bfloat16)  # the kernel takes the activations' dtype
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @classmethod
    def from_float(cls, chunks, bias=None, tiles: bool | None = None) -> "Int8Linear":
        """From float [n, K] row chunks, quantized one chunk at a time."""
        codes, scales = [], []
        for w in chunks:
            scale = w.abs().amax(1).clamp(min=1e-12) / 127
            codes.append((w / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8))
            scales.append(scale)
        return cls(torch.cat(codes), torch.cat(scales), bias, tiles)

    def dequantize(self) -> torch.Tensor:
        """W as float32 [N, K], what the kernel multiplies by."""
        n, k = self.out_features, self.in_features
        if self.layout == "tiles":
            w = self.weight.view(-1, k // GROUP, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(-1, k)[:n]
            return (w.float() - 128) * self.scale[:n, None]
        return self.weight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if self.layout == "tiles":
            y = lowbit_kernel.int8_mm(x.float().contiguous(), self.weight, self.scale)[:, :self.out_features]
        else:
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    @property
    def kernel_kind(self) -> str | None:
        """"int8" where the project's kernel runs this layer and no padding output follows its own (a mixed call's
        columns are every part's outputs: lowbit_kernel.parts), else None."""
        return "int8" if self.layout == "tiles" and self.out_features % TILE == 0 else None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel, {self.layout}"
