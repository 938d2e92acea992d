"""The verifier head's re-scoring picks the very tokens topk picks (heads.best_k), and the exact rows and the
embedding gather the rows advanced indexing gathered."""

import pytest
import torch

from via_sd.weights.gguf_pack import ExactRows
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
    return x


@pytest.mark.parametrize("kind", ["plain", "ties", "nan", "tail", "tied maxima"])
@pytest.mark.parametrize("vocab", [151936, 151936 + 77, 98])
def test_best_k_picks_the_set_topk_picks(kind, vocab):
    for seed, rows in enumerate([1, 3, 8]):
        x = logits(rows, vocab, seed, kind)
        got, want = best_k(x, 16), x.topk(16, dim=-1).indices
        assert got.shape == want.shape
        assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(got.reshape(rows, 16), want.reshape(rows, 16)))


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
