"""The project's kernel layouts (lowbit_kernel.cpp): GGUF's K-quants held exactly, 16 outputs side by side.

int4 (Q4_K): w = q * s + m per group of 32 inputs, q 0..15, s = d * sc and m = dm * mn with fp16 d, dm per
super-block of 256 inputs (8 groups) and 6-bit sc, mn per group: 4.5 bits a weight, as the GGUF stores them.
int6 (Q6_K): w = (q - 32) * s per 16 inputs, q 0..63, s = d * sc with fp16 d per 256 inputs and int8 sc per 16:
6.5625 bits a weight. Both products are exact in fp32 (11 significant bits times 6 or 8), so the kernel's weights
are the gguf package's de-quantized values bit for bit. quantize_int4 puts any float weight on Q4_K's grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP = 32   # inputs of a group (one int8 activation scale each)
TILE = 16    # outputs side by side
SUPER = 8    # groups of a super-block (256 inputs)


def fp16_grid(v: torch.Tensor, low: int, high: int, what: str):
    """v [..., S] -> (d fp16 [...], c int [..., S] in low..high) with float(d) * c == v exactly, |c| of each
    super-block's largest value as large as it can be (what ggml's quantizers write); ValueError naming `what` where
    no such pair exists."""
    shape, v = v.shape, v.reshape(-1, v.shape[-1])
    top = v.abs().amax(-1)
    d, c, left = torch.zeros_like(top), torch.zeros(v.shape), (top > 0).nonzero().flatten()
    for k in range(max(-low, high), 0, -1):
        if not len(left):  # a GGUF's blocks mostly fit at the largest |c|: the other 62-127 tries are not needed
            break
        for sign in (1, -1) if low < 0 else (1,):  # only the blocks still without a pair, from the largest |c|
            cand = sign * top[left] / k
            q = (v[left] / cand[:, None]).round_().clamp_(low, high)
            fits = (cand.half().float() == cand) & (q * cand[:, None] == v[left]).all(-1)
            d[left[fits]], c[left[fits]], left = cand[fits], q[fits], left[~fits]
    if len(left):
        raise ValueError(f"{what} off the GGUF's grid (fp16 per 256 inputs times integers {low}..{high})")
    d, c = d.view(shape[:-1]), c.view(shape)
    return d.half(), c


def on_grid(v: torch.Tensor, nonzero: bool = False) -> torch.Tensor:
    """Values >= 0 [N, G] -> the nearest d * c of their super-block (d fp16, c 0..63; c >= 1 where v > 0 with
    `nonzero`): Q4_K's sub-scales."""
    n, groups = v.shape
    b = F.pad(v, (0, -groups % SUPER)).view(n, -1, SUPER)
    d = (b.amax(-1, keepdim=True) / 63).half().float()
    c = torch.where(d > 0, b / d, 0).round_().clamp_(1 if nonzero else 0, 63)
    return (torch.where(b > 0, c, 0) * d).view(n, -1)[:, :groups]


def quantize_int4(w: torch.Tensor, group: int = GROUP):
    """Float [N, K] -> (codes uint8 0..15, scale, offset) per group of `group` columns, w ~= q * scale + offset, as
    Q4_K quantizes (min / max per group, the min clamped to <= 0), scale and offset on their super-block's grid."""
    n, k = w.shape
    g = w.reshape(n, k // group, group).float()
    lo, hi = torch.aminmax(g, dim=-1)
    lo = lo.clamp(max=0)
    scale = on_grid((hi - lo) / 15, nonzero=True)
    offset = -on_grid(-lo)
    g = (g - offset[..., None]).mul_(torch.where(scale > 0, 1 / scale, 0)[..., None]).round_().clamp_(0, 15)
    return g.to(torch.uint8).reshape(n, k), scale, offset


def _quads(q: torch.Tensor) -> torch.Tensor:
    """Codes [n, K] -> [n / 16, K / 32, 4, 16, 2, 4]: tile, group, quad pair, output, low / high quad, input."""
    n, k = q.shape
    return q.to(torch.uint8).view(n // TILE, TILE, k // GROUP, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)


def _from_quads(b: torch.Tensor) -> torch.Tensor:
    """The inverse of _quads."""
    t, g = b.shape[:2]
    return b.permute(0, 3, 1, 2, 4, 5).reshape(t * TILE, g * GROUP)


def pack_int4(q: torch.Tensor, scale: torch.Tensor, m: torch.Tensor):
    """Codes [n, K] (0..15), scale and offset m [n, K / 32] (w = q s + m, on Q4_K's grid) -> codes uint8
    [n / 16, K / 32, 256] (byte 64 jp + 4 o + i: low nibble input 8 jp + i, high nibble 8 jp + 4 + i) and the
    super-blocks uint8 [n / 16, ceil(K / 256), 256]: fp16 d, then dm = -dmin, of the 16 outputs; then the low 4
    bits of sc (byte 64 + 16 (j / 2) + o, nibble j % 2) and of mn (at 128), the high 2 bits of sc (byte
    192 + 16 (j / 4) + o, bits 2 (j % 4)) and of mn (at 224), for group j of the super-block."""
    n, k = q.shape
    t, g = n // TILE, k // GROUP
    quads = _quads(q)
    codes = (quads[..., 0, :] | (quads[..., 1, :] << 4)).reshape(t, g, 256).contiguous()
    grids = []
    for sign, v in ((1, scale.float()), (-1, -m.float())):  # m = dm * mn with dm = -dmin <= 0, as Q4_K's
        d, c = fp16_grid(F.pad(v, (0, -g % SUPER)).view(n, -1, SUPER), 0, 63, "int4 scales and offsets")
        grids += [sign * d, c.to(torch.uint8)]
    return codes, _int4_blocks(*grids)


def _int4_blocks(d: torch.Tensor, sc: torch.Tensor, dm: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """fp16 d, dm [n, S] and 6-bit sc, mn uint8 [n, S, 8] -> pack_int4's super-blocks [n / 16, S, 256]."""
    t = d.shape[0] // TILE
    halves = [h.view(t, TILE, -1).permute(0, 2, 1).contiguous().view(torch.uint8).view(t, -1, 32) for h in (d, dm)]
    sixes = [c.view(t, TILE, -1, SUPER).permute(0, 2, 3, 1) for c in (sc, mn)]  # tile, super, group, output
    low = [((c[:, :, 0::2] & 15) | ((c[:, :, 1::2] & 15) << 4)).reshape(t, -1, 64) for c in sixes]
    high = [((c[:, :, 0::4] >> 4) | ((c[:, :, 1::4] >> 4) << 2) | ((c[:, :, 2::4] >> 4) << 4)
             | ((c[:, :, 3::4] >> 4) << 6)).reshape(t, -1, 32) for c in sixes]
    return torch.cat([*halves, *low, *high], -1).contiguous()


def q4k_tiles(raw: torch.Tensor):
    """A GGUF Q4_K tensor's blocks, uint8 [n, K / 256 * 144] (per block: fp16 d, fp16 dmin, 12 bytes of packed 6-bit
    sc and mn, 128 bytes of codes), -> pack_int4's codes and super-blocks, by moving bytes and nibbles: nothing is
    de-quantized or searched (pack_int4 finds d and dm again from the products)."""
    n = raw.shape[0]
    b = raw.view(n, -1, 144)
    d = b[..., 0:2].contiguous().view(torch.float16).view(n, -1)
    dmin = b[..., 2:4].clone()
    dmin[..., 1] ^= 0x80  # dm = -dmin: the fp16 sign bit
    s = b[..., 4:16]
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    # codes: byte x of pair p holds input x of group 2p (low nibble) and of group 2p + 1 (high); x = 8 jp + 4 h + i
    qs = b[..., 16:].reshape(n, -1, 4, 4, 2, 4)
    even = (qs[..., 0, :] & 15) | ((qs[..., 1, :] & 15) << 4)
    odd = (qs[..., 0, :] >> 4) | (qs[..., 1, :] & 0xF0)
    groups = torch.stack([even, odd], 3).view(n // TILE, TILE, -1, 4, 4)  # tile, output, group, jp, i
    codes = groups.permute(0, 2, 3, 1, 4).reshape(n // TILE, -1, 256).contiguous()
    return codes, _int4_blocks(d, sc, dmin.view(torch.float16).view(n, -1), mn)


def unpack_int4(codes: torch.Tensor, blocks: torch.Tensor):
    """The inverse of pack_int4: codes [n, K] and (s, m) [n, K / 32] as float32."""
    t, g = codes.shape[:2]
    b = codes.view(t, g, 4, TILE, 4)
    q = _from_quads(torch.stack([b & 15, b >> 4], -2))
    nb, values = blocks.shape[1], []
    for which in range(2):  # scales, then offsets
        d = blocks[..., 32 * which:32 * which + 32].contiguous().view(torch.float16).float()  # [t, B, 16]
        low = blocks[..., 64 + 64 * which:128 + 64 * which].reshape(t, nb, 4, 1, TILE)
        high = blocks[..., 192 + 32 * which:224 + 32 * which].reshape(t, nb, 2, 1, TILE)
        low = (low >> torch.tensor([0, 4], dtype=torch.uint8).view(1, 1, 1, 2, 1)) & 15
        high = (high >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 1, 4, 1)) & 3
        c = (low.reshape(t, nb, SUPER, TILE) | (high.reshape(t, nb, SUPER, TILE) << 4)).float()
        values.append((d[:, :, None] * c).permute(0, 3, 1, 2).reshape(t * TILE, nb * SUPER)[:, :g])
    return q, values[0], values[1]


def pack_int6(q: torch.Tensor, scale: torch.Tensor):
    """Q6_K codes [n, K] (0..63) and scales [n, K / 16] (w = (q - 32) s) -> codes uint8 [n / 16, K / 32, 384] (bytes
    0..255: the low 4 bits as pack_int4's; byte 256 + 64 h + 4 o + i, bits 2 k: the high 2 bits of input
    16 h + 4 k + i) and the super-blocks uint8 [n / 16, K / 256, 288]: fp16 d of the 16 outputs, then int8 sc of
    sub-block u (16 inputs) of output o at byte 32 + 16 u + o."""
    n, k = q.shape
    if k % (SUPER * GROUP):
        raise ValueError(f"Q6_K weights take whole super-blocks of 256 inputs, not {k}")
    d, c = fp16_grid(scale.float().view(n, -1, 2 * SUPER), -128, 127, "Q6_K scales")
    return _int6_codes(q), _int6_blocks(d, c.to(torch.int8))


def _int6_codes(q: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    t, g = n // TILE, k // GROUP
    quads = _quads(q & 15)
    low = (quads[..., 0, :] | (quads[..., 1, :] << 4)).reshape(t, g, 256)
    top = (q >> 4).to(torch.uint8).view(t, TILE, g, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)  # tile, group, h, o, i, k
    high = (top[..., 0] | (top[..., 1] << 2) | (top[..., 2] << 4) | (top[..., 3] << 6)).reshape(t, g, 128)
    return torch.cat([low, high], -1).contiguous()


def _int6_blocks(d: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """fp16 d [n, S] and int8 sc [n, S, 16] -> pack_int6's super-blocks [n / 16, S, 288]."""
    t = d.shape[0] // TILE
    d = d.view(t, TILE, -1).permute(0, 2, 1).contiguous().view(torch.uint8).view(t, -1, 32)
    c = sc.view(t, TILE, -1, 2 * SUPER).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
    return torch.cat([d, c.reshape(t, -1, 256)], -1).contiguous()


def q6k_tiles(raw: torch.Tensor, codes: torch.Tensor):
    """A GGUF Q6_K tensor's blocks, uint8 [n, K / 256 * 210] (per block: 128 bytes of low and 64 of high code bits,
    16 int8 sc, fp16 d), and its codes 0..63 [n, K] (gguf_codes.decompose) -> pack_int6's codes and super-blocks,
    d and sc taken as they are."""
    n = raw.shape[0]
    b = raw.view(n, -1, 210)
    d = b[..., 208:210].contiguous().view(torch.float16).view(n, -1)
    return _int6_codes(codes), _int6_blocks(d, b[..., 192:208].contiguous().view(torch.int8))


def unpack_int6(codes: torch.Tensor, blocks: torch.Tensor):
    """The inverse of pack_int6: codes [n, K] (0..63) and scales [n, K / 16] as float32."""
    t, g = codes.shape[:2]
    b = codes[..., :256].reshape(t, g, 4, TILE, 4)
    low = _from_quads(torch.stack([b & 15, b >> 4], -2))
    h = codes[..., 256:].reshape(t, g, 2, TILE, 4, 1) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
    high = (h & 3).permute(0, 3, 1, 2, 5, 4).reshape(t * TILE, g * GROUP)
    d = blocks[..., :32].contiguous().view(torch.float16).float()  # [t, B, 16]
    c = blocks[..., 32:].contiguous().view(torch.int8).float().view(t, -1, 2 * SUPER, TILE)
    scale = (d[:, :, None] * c).permute(0, 3, 1, 2).reshape(t * TILE, -1)
    return low | (high << 4), scale
