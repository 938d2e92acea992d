"""The verifier through the lean forward (weights/lean_forward.py) computes bit for bit what transformers' forward and
routing.SlimVerifier compute on the project's kernel: the full verifier, the slim one (a route's sub-layers skipped)
and progressive verification's two views, through a prompt read, one-token steps, k-row passes (k = 1..8) after a
context and rollbacks; and greedy SD and VIA-SD still equal AR. tests/embedded/test_lean_verifier.py checks the same
on the embedded pair."""

import copy

import pytest
import torch

from via_sd import DecodeConfig, generate, load_pair, tiny_random_pair
from via_sd.core.cached import CachedModel, LeanDecoder, model_cache
from via_sd.core.progressive import ProgressiveVerifier
from via_sd.weights import lowbit_kernel
from via_sd.weights.fused import fuse_linears
from via_sd.weights.lean_cache import LeanCache
from via_sd.weights.linears import Int8Linear
from via_sd.weights.row_attention import use_row_attention
from via_sd.weights.settings import apply_weights

pytestmark = pytest.mark.skipif(lowbit_kernel.module() is None, reason="the project's kernel did not build here")

ROUTE = ["attn.1", "mlp.2"]  # a layer's attention and another's MLP: sub-layers skipped on both sides of a kept one
SCHEDULE = [(30, 1), (31, 1), (32, 1), *((32 + k, k) for k in range(1, 9)), (33, 2), (34, 1), (45, 11), (44, 1)]


def fused_pair(v_int8: bool):
    """The tiny pair at twice the width, its verifier in int4 with q/k/v (or q/k, its v_proj made int8) and gate/up
    fused (fused.py), as the embedded verifier's layers are."""
    pair = tiny_random_pair(seed=0, hidden=128)
    apply_weights(pair.verifier, "int4")
    use_row_attention(pair.verifier)
    for layer in pair.verifier.model.layers:
        if v_int8:
            v = layer.self_attn.v_proj
            layer.self_attn.v_proj = Int8Linear.from_float([v.dequantize()], v.bias)
    assert fuse_linears(pair.verifier) == 2 * len(pair.verifier.model.layers)
    pair.set_route(ROUTE)
    return pair


@pytest.fixture(scope="module", params=["separate", "q/k/v fused", "q/k fused, v int8"])
def pair(request):
    if request.param == "separate":
        return load_pair("random", weights="int4", route=ROUTE)
    pair = fused_pair(v_int8=request.param.endswith("int8"))
    layer = pair.slim.lean.layers[0]
    assert layer.gate_up is not None and (layer.qk if request.param.endswith("int8") else layer.qkv) is not None
    return pair


def old_slim(pair):
    """The slim verifier as it ran before the lean forward: transformers' layers over a DynamicCache."""
    slim = copy.copy(pair.slim)
    slim._lean = None
    return slim


def same_bits(reference, lean, seq, schedule=SCHEDULE):
    for upto, keep in schedule:
        lean.rollback(upto - keep)  # a k-row pass after the context: each starts from the same cache
        reference.rollback(upto - keep)
        a, b = reference.logits(seq, upto, keep), lean.logits(seq, upto, keep)
        assert a.shape == b.shape == (keep, a.shape[-1]) and torch.equal(a, b), (upto, keep, (a - b).abs().max())


def sequence(pair, n=50):
    return torch.randint(0, pair.vocab_size, (n,), generator=torch.Generator().manual_seed(5)).tolist()


def test_the_full_verifier_gives_transformers_bits(pair):
    lean = model_cache(pair.verifier, pair.vocab_size, "cpu", "cpu")
    assert isinstance(lean, LeanDecoder) and pair.slim.lean.exact
    same_bits(CachedModel(pair.verifier, pair.vocab_size, "cpu", "cpu"), lean, sequence(pair))


def test_the_slim_verifier_gives_its_own_bits_with_the_routes_sub_layers_skipped(pair):
    assert pair.slim.skip_set == {2, 5}
    lean = model_cache(pair.slim, pair.vocab_size, "cpu", "cpu")
    assert isinstance(lean, LeanDecoder) and lean.skip == {2, 5}
    seq = sequence(pair)
    same_bits(CachedModel(old_slim(pair), pair.vocab_size, "cpu", "cpu"), lean, seq)
    full = CachedModel(pair.verifier, pair.vocab_size, "cpu", "cpu")
    assert not torch.equal(full.logits(seq, 40, 1), lean.logits(seq, 40, 1))  # the route does skip something


@pytest.mark.parametrize("slim_cache", ["own", "full"])
def test_progressive_views_give_the_bits_of_their_dynamic_cache_twins(pair, slim_cache):
    lean = ProgressiveVerifier(pair.slim, pair.vocab_size, "cpu", slim_cache=slim_cache)
    old = ProgressiveVerifier(old_slim(pair), pair.vocab_size, "cpu", slim_cache=slim_cache)
    assert isinstance(lean.cache, LeanCache) and not isinstance(old.cache, LeanCache)
    seq = sequence(pair)
    # slim passes, full passes resuming from them, rollbacks: what a VIA-SD round does
    for view, upto, keep in [("full", 30, 1), ("slim", 33, 3), ("full", 33, 3), ("slim", 34, 1), ("slim", 38, 4),
                             ("full", 36, 3), ("slim", 40, 4), ("full", 40, 4), ("full", 41, 1)]:
        a, b = old.view(view).logits(seq, upto, keep), lean.view(view).logits(seq, upto, keep)
        assert torch.equal(a, b), (view, upto, keep)
    twin = lean.fork()  # a fork holds buffers of its own
    twin.view("full").logits(seq, 45, 1)
    assert lean.view("full").seen == 41 and torch.equal(lean.view("full").logits(seq, 42, 1),
                                                        old.view("full").logits(seq, 42, 1))


def test_greedy_sd_equals_ar_through_the_lean_verifier(pair):
    config = DecodeConfig(max_new_tokens=40, seed=0, gamma=4)
    ar = generate(pair, "def merge(a, b):", method="ar", config=config)
    assert generate(pair, "def merge(a, b):", method="sd", config=config).token_ids == ar.token_ids


def test_via_sd_decides_as_it_did_through_transformers_forward(pair, monkeypatch):
    """Tokens and every probability (full, slim, draft) of a VIA-SD run, lean or not (its tier A keeps drafts no
    verifier saw: its output is not AR's, but it must not move)."""
    config = DecodeConfig(max_new_tokens=40, seed=0, gamma=4, reuse_opening=False)

    def run():
        r = generate(pair, "def merge(a, b):", method="via", config=config)
        return r.token_ids, [[t["q_full"], t["q_slim"], t["p_draft"]] for t in r.tokens]

    lean = run()
    monkeypatch.setattr("via_sd.core.cached.exact", lambda model: False)
    monkeypatch.setattr(pair, "slim", old_slim(pair))
    assert not isinstance(model_cache(pair.slim, pair.vocab_size, "cpu", "cpu"), LeanDecoder)
    assert run() == lean
