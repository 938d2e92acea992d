"""The drafter's lean forward (via_sd/weights/lean_forward.py) computes what transformers' forward computes, to float
rounding, through prompt reads, one-token steps, multi-row passes after a cache and rollbacks; greedy SD
with it still equals greedy AR; models it cannot run keep transformers' forward."""

import copy

import pytest
import torch

from via_sd import DecodeConfig, generate
from via_sd.core.cached import CachedModel, drafter_cache
from via_sd.weights.fused import fuse_linears
from via_sd.weights.lean_forward import LeanDecoder, supports


def tiny_llama(**overrides):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, **overrides)
    return AutoModelForCausalLM.from_config(config).eval()


def tiny_qwen2():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config).eval()


def same_logits(model, atol):
    """Both caches through the same schedule of passes: prompt, steps, a 3-row pass, rollback, refeed."""
    seq = torch.randint(0, 128, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    ref, lean = CachedModel(model, 128, "cpu", "cpu"), LeanDecoder(model, 128, "cpu", "cpu")
    for upto, keep in [(20, 1), (21, 1), (22, 1), (25, 3), (23, 2), (24, 1), (30, 6), (28, 1), (40, 12), (60, 20)]:
        a, b = ref.logits(seq, upto, keep), lean.logits(seq, upto, keep)
        assert a.shape == b.shape == (keep, 128) and lean.seen == ref.seen == upto
        torch.testing.assert_close(b, a, atol=atol, rtol=0)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2 (q/k/v bias)"])
def test_lean_forward_gives_transformers_logits_in_fp32(build):
    model = build()
    assert supports(model)
    same_logits(model, atol=1e-4)


def test_lean_forward_on_fused_int4_layers_runs_one_matmul_for_q_k_v(monkeypatch):
    from via_sd.weights import lowbit_kernel
    from via_sd.weights.settings import apply_weights

    model = apply_weights(tiny_llama(), "int4")
    fused = copy.deepcopy(model)
    assert fuse_linears(fused) == 4
    same_logits(model, atol=2e-2)  # bf16 activations into the kernel: rounding of ~1e-2
    same_logits(fused, atol=2e-2)
    if not lowbit_kernel.available():  # torch's kernels: the stacked layer's module runs once for q, k and v
        calls = []
        layer = fused.model.layers[0].self_attn.q_proj.fused.layer
        hook = layer.register_forward_hook(lambda *a: calls.append(1))
        LeanDecoder(fused, 128, "cpu", "cpu").logits(list(range(10)), 10, 1)
        hook.remove()
        assert len(calls) == 1
        return
    # the project's kernel: a sub-layer is one call, and its q/k/v one group; fused, that group is one stacked layer
    seen = []
    run = lowbit_kernel.attention_sublayer
    monkeypatch.setattr(lowbit_kernel, "attention_sublayer", lambda *a: seen.append(a[3].kinds) or run(*a))
    for m, parts in ((fused, [4]), (model, [4, 4, 4])):
        seen.clear()
        decoder = LeanDecoder(m, 128, "cpu", "cpu")
        assert decoder.net.kernel
        decoder.logits(list(range(10)), 10, 1)
        assert seen == [parts] * len(m.model.layers)


def test_the_cache_grows_past_its_first_capacity_and_keeps_what_it_held():
    model = tiny_llama(max_position_embeddings=1024)
    seq = torch.randint(0, 128, (600,), generator=torch.Generator().manual_seed(3)).tolist()
    ref, lean = CachedModel(model, 128, "cpu", "cpu"), LeanDecoder(model, 128, "cpu", "cpu")
    for upto, keep in [(200, 1), (255, 1), (257, 2), (600, 1)]:  # 256 rows at first, then 512, then 1024
        torch.testing.assert_close(lean.logits(seq, upto, keep), ref.logits(seq, upto, keep), atol=1e-4, rtol=0)
    assert lean.cache.keys[0].shape[1] == 1024


def test_rope_rows_from_the_table_have_the_bits_of_a_pass_alone():
    """A default RoPE's cos / sin come from a table of positions 0.. (grown past its first 256 rows): each row has the
    bits the rotary module gives that pass alone. A RoPE whose frequencies follow the length (dynamic) is not
    tabled."""
    net = LeanDecoder(tiny_llama(max_position_embeddings=1024), 128, "cpu", "cpu").net
    assert net.rope_fixed
    h = torch.zeros(1, 1, 128)
    for start, n in [(0, 7), (250, 9), (600, 3), (5, 1)]:  # 250 + 9 and 600 grow the table
        got = net._rope(h, start, n)
        alone = net._rope_of(h, start, n)
        assert all(torch.equal(a, b) and a.is_contiguous() for a, b in zip(got, alone))
    assert net.rope_rows[0].shape[0] == 1024
    dynamic = LeanDecoder(tiny_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
                          128, "cpu", "cpu").net
    assert not dynamic.rope_fixed and dynamic._rope(h, 0, 4)[0].shape == (4, 32) and dynamic.rope_rows is None


def test_models_it_cannot_run_keep_transformers_forward():
    assert not supports(tiny_llama(layer_types=["full_attention", "sliding_attention"], sliding_window=8))
    assert isinstance(drafter_cache(tiny_llama(layer_types=["full_attention", "sliding_attention"], sliding_window=8),
                                    128, "cpu", "cpu"), CachedModel)
    assert isinstance(drafter_cache(tiny_llama(), 128, "cpu", "cpu"), LeanDecoder)
    model = tiny_llama()
    model.model.layers[0].self_attn.q_proj._hf_hook = object()  # placed by accelerate: its hooks move tensors
    assert not supports(model)


def test_greedy_sd_with_the_lean_drafter_equals_ar(tiny_pair):
    assert supports(tiny_pair.drafter)
    config = DecodeConfig(max_new_tokens=40, gamma=4)
    ar = generate(tiny_pair, "hello there", "ar", config)
    sd = generate(tiny_pair, "hello there", "sd", config)
    ids = [[t["id"] for t in trace.tokens] for trace in (ar, sd)]
    assert ids[0] == ids[1] and len(ids[0]) == 40
    assert sd.summary["mean_accepted_length"] > 1.0  # drafts were proposed and kept


