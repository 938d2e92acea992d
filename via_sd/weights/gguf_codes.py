"""GGUF tensors -> integer codes with per-group scale and offset, straight from the blocks.

Every GGUF block type we take is, per group of `group` weights along a row, an affine map of small
unsigned integer codes:

    w = (codes - zero) * scale [+ offset]

    type   bits group  zero  scale          offset
    Q4_0    4    32     8    d              -
    Q4_1    4    32     0    d              m
    Q5_0    5    32    16    d              -
    Q5_1    5    32     0    d              m
    Q8_0    8    32   128    d              -
    Q4_K    4    32     0    d * sc[j]      -dmin * m[j]
    Q5_K    5    32     0    d * sc[j]      -dmin * m[j]
    Q6_K    6    16    32    d * sc[j]      -

computed in float32 in the same order as the `gguf` package's reference de-quantizer, so
`dequantize(decompose(...))` equals `gguf.quants.dequantize(...)` bit for bit. F32 / F16 / BF16
tensors stay floats. Anything else (IQ*, Q2_K, Q3_K, TQ*, MXFP4...) is an UnsupportedTensorType.
Nothing here builds the whole float model: one tensor at a time, as numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class UnsupportedTensorType(ValueError):
    """A GGUF tensor type we cannot unpack; names the type, the tensor and the file."""


@dataclass
class Codes:
    """A [rows, cols] weight as codes (uint8, one per weight) with per-group scale / offset."""

    codes: np.ndarray            # uint8 [rows, cols]
    scale: np.ndarray            # float32 [rows, cols // group]
    offset: np.ndarray | None    # float32 [rows, cols // group] or None
    zero: int
    bits: int
    group: int
    type: str

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> np.ndarray:
        rows, cols = self.codes.shape
        q = (self.codes.astype(np.int16) - self.zero).astype(np.float32).reshape(rows, -1, self.group)
        w = q * self.scale[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.reshape(rows, cols)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.view(np.float16).astype(np.float32)


def _fields(qs: np.ndarray, runs: int, width: int, bits: int) -> np.ndarray:
    """The `bits`-wide fields of each run of `width` bytes, lowest first: field f of every byte of the run, then field
    f + 1 (ggml's order). One shift and mask per field into its place: numpy's broadcast of a shift array over the
    bytes was 9x slower (the unpacking of a first start)."""
    n, fields = qs.shape[0], 8 // bits
    q, out = qs.reshape(n, runs, width), np.empty((n, runs, fields, width), np.uint8)
    for f in range(fields):
        np.bitwise_and(q >> np.uint8(bits * f), np.uint8((1 << bits) - 1), out=out[:, :, f])
    return out.reshape(n, runs * fields * width)


def _nibbles(qs: np.ndarray, runs: int, width: int) -> np.ndarray:
    """Low nibbles of each run of `width` bytes, then their high nibbles (ggml's order)."""
    return _fields(qs, runs, width, 4)


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    """Bit i of a little-endian uint32 per block, i = 0..31."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(b):
    d, qs = b[:, :2], b[:, 2:]
    return _nibbles(qs, 1, 16), _f16(d), None, 8, 4, 32


def _q4_1(b):
    d, m, qs = b[:, :2], b[:, 2:4], b[:, 4:]
    return _nibbles(qs, 1, 16), _f16(d), _f16(m), 0, 4, 32


def _q5_0(b):
    d, qh, qs = b[:, :2], b[:, 2:6], b[:, 6:]
    return _nibbles(qs, 1, 16) | (_high_bits32(qh) << np.uint8(4)), _f16(d), None, 16, 5, 32


def _q5_1(b):
    d, m, qh, qs = b[:, :2], b[:, 2:4], b[:, 4:8], b[:, 8:]
    return _nibbles(qs, 1, 16) | (_high_bits32(qh) << np.uint8(4)), _f16(d), _f16(m), 0, 5, 32


def _q8_0(b):
    d, x = b[:, :2], b[:, 2:]
    return (x.view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(d), None, 128, 8, 32


def _k_scales(b):
    from gguf.quants import Q4_K

    d, dmin, scales = _f16(b[:, :2]), _f16(b[:, 2:4]), b[:, 4:16]
    sc, m = Q4_K.get_scale_min(scales.copy())
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b):
    scale, offset = _k_scales(b)
    return _nibbles(b[:, 16:], 4, 32), scale, offset, 0, 4, 32


def _q5_k(b):
    scale, offset = _k_scales(b)
    qh, qs = b[:, 16:48], b[:, 48:]
    return _nibbles(qs, 4, 32) | (_fields(qh, 1, 32, 1) << np.uint8(4)), scale, offset, 0, 5, 32


def _q6_k(b):
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    scale = _f16(d) * scales.copy().view(np.int8).astype(np.float32)
    low = _nibbles(ql, 2, 64)
    high = _fields(qh, 2, 32, 2)
    return low | (high << np.uint8(4)), scale, None, 32, 6, 16


DECOMPOSE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *DECOMPOSE)


def decompose(data: np.ndarray, type_name: str, shape: tuple[int, int], where: str = "") -> Codes:
    """Raw blocks of a [rows, cols] tensor (uint8, [rows, bytes_per_row]) -> Codes."""
    if type_name not in DECOMPOSE:
        raise UnsupportedTensorType(f"GGUF tensor type {type_name} is not supported{where}; "
                                    f"supported: {', '.join(SUPPORTED)}")
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rows, cols = shape
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(rows * cols // block, nbytes)
    codes, scale, offset, zero, bits, group = DECOMPOSE[type_name](blocks)
    return Codes(codes.reshape(rows, cols), scale.reshape(rows, cols // group).astype(np.float32),
                 None if offset is None else offset.reshape(rows, cols // group).astype(np.float32),
                 zero, bits, group, type_name)
