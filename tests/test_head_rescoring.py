"""The verifier head's re-scoring picks the very tokens topk picks (heads.best_k), and the exact rows and the
embedding gather the rows advanced indexing gathered."""

from contextlib import nullcontext

import pytest
import torch

from via_sd.weights import lowbit_kernel
from via_sd.weights.gguf_pack import ExactRows, decompose
from via_sd.weights.heads import CHUNK, LowbitEmbedding, RescoredHead, best_k
from via_sd.weights.linears import Int4Linear


def logits(rows: int, vocab: int, seed: int, kind: str) -> torch.Tensor:
    x = torch.randn(1, rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4
    if kind == "ties":  # many equal logits: at the k-th, topk itself decides
        x = x.round()
    elif kind == "nan":
        x[0, 0, 17] = float("nan")
    elif kind == "tail":  # the best logit past the last whole chunk
        x[0, -1, -3] = 50.0
    elif kind == "tied maxima":  # two chunks whose maxima tie at the k-th
        x[0, 0, ::CHUNK] = 30.0
    elif kind == "tie at the k-th" and vocab > 40 * CHUNK:  # the 16th and 17th logits equal, in chunks ranked apart
        x[0, 0, 7 * CHUNK + 9::2 * CHUNK][:15] = torch.arange(40.0, 55.0)  # chunk 7 and 14 more ranked first
        x[0, 0, 100], x[0, 0, 7 * CHUNK + 50] = 30.0, 30.0  # chunk 0 ranks below chunk 7
    return x


@pytest.mark.parametrize("kind", ["plain", "ties", "nan", "tail", "tied maxima", "tie at the k-th"])
@pytest.mark.parametrize("vocab", [151936, 151936 + 77, 98])
@pytest.mark.parametrize("path", ["kernel", "ATen"])  # head_rows.cpp's best_k_rows where the kernel is built
def test_best_k_picks_the_set_topk_picks(kind, vocab, path):
    if path == "kernel" and not lowbit_kernel.available():
        pytest.skip(f"kernel not built: {lowbit_kernel.why_not()}")
    for seed, rows in enumerate([1, 3, 8]):
        x = logits(rows, vocab, seed, kind)
        if kind == "nan" and rows > 1 and vocab > 3 * CHUNK:
            x[0, 1, 2 * CHUNK + 5] = float("-inf")  # and a -inf, and a NaN in the tail of another row
            x[0, 2, -1] = float("nan")
        with nullcontext() if path == "kernel" else lowbit_kernel.off():
            got = best_k(x, 16)
        want = x.topk(16, dim=-1).indices
        assert got.shape == want.shape
        assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(got.reshape(rows, 16), want.reshape(rows, 16)))


@pytest.mark.skipif(not lowbit_kernel.available(), reason=f"kernel not built: {lowbit_kernel.why_not()}")
def test_the_kernels_q6_k_rows_are_the_bits_numpy_gives():
    """head_rows.cpp's q6k_rows against the numpy de-quantizer it stands in for (ExactRows under off()), with fp16 d
    normal, subnormal and large."""
    import numpy as np
    from test_weights import k_quant_blocks

    raw = k_quant_blocks("Q6_K", rows=300, cols=512)
    d = raw.reshape(-1, 210)[:, -2:].copy().view(np.float16)
    d[::7], d[3::11] = np.float16(3e-6), np.float16(-900.0)  # fp16 subnormals, and a large negative scale
    raw.reshape(-1, 210)[:, -2:] = d.view(np.uint8)
    rows, ids = ExactRows(torch.from_numpy(raw), "Q6_K", 512), torch.tensor([[0, 299, 17], [17, 150, 3]])
    with lowbit_kernel.off():
        want = rows(ids)
    assert torch.equal(want[0, 0], torch.from_numpy(decompose(raw[:1], "Q6_K", (1, 512)).dequantize())[0])
    assert torch.equal(rows(ids), want)


def test_the_rescored_head_gives_what_it_gave_with_topk():
    """RescoredHead with best_k, against the same re-scoring written with topk."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from test_weights import k_quant_blocks

    torch.manual_seed(0)
    w = torch.randn(4096, 256) * 0.3
    raw = k_quant_blocks("Q6_K", rows=4096, cols=256)  # the exact rows: a GGUF tensor's Q6_K blocks
    head = RescoredHead(Int4Linear.from_float(w), ExactRows(torch.from_numpy(raw), "Q6_K", 256))
    h = torch.randn(1, 5, 256)
    out = head(h)
    low = head.head(h)
    top = low.topk(16, dim=-1).indices
    exact = (head.exact_rows(top) * h.float().unsqueeze(-2)).sum(-1)
    floor = torch.nextafter(exact.amin(-1, keepdim=True), torch.tensor(float("-inf")))
    assert torch.equal(out, torch.minimum(low, floor).scatter_(-1, top, exact))
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q6_K).reshape(4096, 256))
    assert torch.equal(head.exact_rows(top)[0, 0], reference[top[0, 0]])


def test_the_embedding_gathers_the_rows_indexing_gathered():
    codes = torch.randint(0, 16, (300, 64), dtype=torch.uint8)
    scale, offset = torch.rand(300, 2), torch.randn(300, 2)
    table = LowbitEmbedding(codes, scale, offset, zero=8, group=32)
    ids = torch.tensor([[3, 299, 0, 3]])
    want = ((codes[ids].float() - 8).view(1, 4, 2, 32) * scale[ids][..., None] + offset[ids][..., None]).view(1, 4, 64)
    assert torch.equal(table(ids), want)
