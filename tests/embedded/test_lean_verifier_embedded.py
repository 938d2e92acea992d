"""On the embedded pair, the verifier through the lean forward gives transformers' forward's bits (and the slim
verifier SlimVerifier's): one-token steps and k-row passes (k = 1..8) after a context, with and without the route's
skipped sub-layers, and through progressive verification's views (tests/test_lean_verifier.py: the tiny pair)."""

import copy

import pytest
import torch

from via_sd.core.cached import CachedModel, LeanDecoder, model_cache
from via_sd.core.progressive import ProgressiveVerifier

pytestmark = pytest.mark.embedded

TEXT = ("def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n"
        "    return out + a + b\n")


def passes(context: int):
    """A prompt read, three one-token steps, then k-row passes k = 1..8 from the same cache."""
    return [(context, 1), (context + 1, 1), (context + 2, 1), (context + 3, 1),
            *((context + 3 + k, k) for k in range(1, 9))]


def test_the_lean_verifier_gives_transformers_bits_on_real_weights(embedded_pair):
    pair = embedded_pair
    seq = pair.encode(TEXT, chat=False)
    assert pair.route.skip and len(seq) >= 36
    old_slim = copy.copy(pair.slim)
    old_slim._lean = None
    models = [(CachedModel(pair.verifier, pair.vocab_size, "cpu", "cpu"), model_cache(pair.verifier, pair.vocab_size,
                                                                                      "cpu", "cpu")),
              (CachedModel(old_slim, pair.vocab_size, "cpu", "cpu"), model_cache(pair.slim, pair.vocab_size, "cpu",
                                                                                  "cpu"))]
    for reference, lean in models:
        assert isinstance(lean, LeanDecoder)
        for upto, keep in passes(24):
            reference.rollback(upto - keep)
            lean.rollback(upto - keep)
            assert torch.equal(reference.logits(seq, upto, keep), lean.logits(seq, upto, keep)), (upto, keep)
    both = {name: ProgressiveVerifier(slim, pair.vocab_size, "cpu", slim_cache="full") for name, slim in
            (("old", old_slim), ("lean", pair.slim))}
    for view, upto, keep in [("full", 24, 1), ("slim", 28, 4), ("full", 28, 4), ("slim", 36, 8), ("full", 33, 5)]:
        a, b = (both[name].view(view).logits(seq, upto, keep) for name in ("old", "lean"))
        assert torch.equal(a, b), (view, upto, keep)
