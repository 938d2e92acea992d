"""Exact at every length: int4 passes of any length equal their one-token steps bit for bit, windows hold
under int4, route search runs the engine's own forward, the slim verifier runs through accelerate's hooks,
and the GPU check's decode loop runs (tiny, on CPU)."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma3TextConfig, LlamaConfig, MistralConfig

from via_sd import DecodeConfig, generate
from via_sd.weights.settings import Int4Linear, apply_weights
from via_sd.core.pair import ModelPair, _suppress_token, char_tokenizer
from via_sd.route_search import Calibration, TeacherForced
from via_sd.core.routing import Route, SlimVerifier, resolve_route
from via_sd.weights.row_attention import NAME, use_row_attention

from test_architectures import CONFIGS, build

VOCAB = 96  # a multiple of 16, so the output head is an int4 linear too (the char tokenizer's id 96 is never used)


def exact_int4(model):
    """int4 weights and row attention."""
    apply_weights(model, "int4")
    assert use_row_attention(model) and model.config._attn_implementation == NAME
    return model


def llama(layers: int, seed: int = 1, hidden: int = 64):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=1, pad_token_id=1)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # sharper outputs, as trained models have
        model.lm_head.weight.mul_(40.0)
    return model


def int4_pair() -> ModelPair:
    """A tiny int4 drafter (the verifier's embedding, first two layers and head) and 4-layer verifier."""
    verifier = llama(4)
    with torch.no_grad():
        for layer in verifier.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(0.3)
            layer.mlp.down_proj.weight.mul_(0.3)
    drafter = llama(2, seed=2)
    drafter.load_state_dict(verifier.state_dict(), strict=False)
    tokenizer = char_tokenizer()
    for model in (drafter, verifier):
        exact_int4(model)
        _suppress_token(model, tokenizer.eos_token_id)
        model.generation_config.eos_token_id = None
    slim = SlimVerifier(verifier, resolve_route(["attn.1", "mlp.2"], 4))
    return ModelPair(drafter, verifier, slim, tokenizer, "int4-llama-2L", "int4-llama-4L", torch.device("cpu"),
                     torch.float32, "int4", "int4")


@pytest.fixture(scope="module")
def pair():
    return int4_pair()


@pytest.mark.parametrize("rows", [16, 64, 65, 130])
def test_an_int4_pass_of_any_length_over_a_cache_gives_the_logits_of_one_token_steps(rows):
    """A pass over a cache, of any length, gives its one-token steps' logits bit for bit."""
    model = exact_int4(llama(4))
    ids = torch.randint(2, VOCAB, (1, 20 + rows), generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        cache = DynamicCache()
        model(ids[:, :20], past_key_values=cache)
        steps = torch.cat([model(ids[:, i:i + 1], past_key_values=cache).logits for i in range(20, 20 + rows)], 1)
        cache.crop(-rows)
        one_pass = model(ids[:, 20:], past_key_values=cache).logits
    assert torch.equal(one_pass, steps)


@pytest.mark.parametrize("gamma", [16, 64])
def test_greedy_sd_equals_greedy_ar_on_an_int4_pair_at_long_drafts(pair, gamma):
    config = DecodeConfig(gamma=gamma, max_new_tokens=2 * gamma + 8, temperature=0.0)
    prompt = "The quick brown fox jumps"
    ar, sd = generate(pair, prompt, "ar", config), generate(pair, prompt, "sd", config)
    assert len(ar.token_ids) == config.max_new_tokens
    assert sd.token_ids == ar.token_ids
    assert max(len(r["candidates"]) for r in sd.rounds) == gamma  # verification passes of gamma + 1 > 64 rows


def windowed(kind: str):
    """A tiny sliding-window model (window 8) in fp32, with weights int4 can take."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, sliding_window=8)
    config = {"mistral": lambda: MistralConfig(**common),
              "gemma3_text": lambda: Gemma3TextConfig(**common, head_dim=16,
                                                      layer_types=["sliding_attention", "full_attention"] * 2)}[kind]()
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():  # larger weights make every sub-layer, and so the window, matter
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
        model.lm_head.weight.mul_(10.0)
    return model


@pytest.mark.parametrize("kind", ["mistral", "gemma3_text"])
def test_a_sliding_window_family_under_int4_keeps_its_window_and_matches_its_fp32_self(kind):
    """The int4 model with row attention (verifier and slim view: a prompt, then one 32-row pass over the cache;
    window 8, run 40) against the same int4 weights run by transformers' own SDPA in one pass, and against the
    de-quantized weights in fp32, which differ by the bf16 rounding of activations only."""
    model = windowed(kind)
    reference = copy.deepcopy(model)
    exact_int4(model)
    stock = copy.deepcopy(model)
    stock.set_attn_implementation("sdpa")
    ids = torch.randint(2, VOCAB, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():  # W itself: the kernel's product with the identity (exact in bf16 and fp32)
        for name, m in model.named_modules():
            if isinstance(m, Int4Linear):
                reference.get_submodule(name).weight.data = m(torch.eye(m.in_features)).T.clone()
        fp32, same_int4 = reference(ids).logits[0], stock(ids).logits[0]
        reference.config.sliding_window = 10_000  # the same weights without a window: it must matter
        window_effect = (reference(ids).logits[0] - fp32).abs().max()
        for forward in (model, SlimVerifier(model, Route("none", (), 4))):
            cache = DynamicCache()
            got = torch.cat([forward(ids[:, :8], past_key_values=cache).logits[0],
                             forward(ids[:, 8:], past_key_values=cache).logits[0]])
            torch.testing.assert_close(got, same_int4, rtol=1e-4, atol=1e-4)
            assert (got - fp32).abs().max() < window_effect / 2
            assert (got.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_route_search_runs_the_engines_slim_forward_on_every_family(kind):
    model = build(kind)
    seq = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    tf = TeacherForced(model, Calibration([seq], [6]))
    skip = {3, 4}  # mlp.1, attn.2
    slim = SlimVerifier(model, resolve_route(["mlp.1", "attn.2"], 4))
    logits = slim(torch.tensor([seq]), past_key_values=DynamicCache()).logits[0, 5:19]
    torch.testing.assert_close(tf.log_probs(skip), torch.log_softmax(logits.float(), -1), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([seq])).logits[0, 5:19].float(), -1)
    torch.testing.assert_close(tf.full_logp, full, rtol=1e-4, atol=1e-4)  # route "none" is the model itself
    base = tf.evaluate({3}, record=True)
    assert tf.evaluate(skip, start=4, base=base).kl == pytest.approx(tf.evaluate(skip).kl, abs=1e-7)


def test_the_slim_verifier_runs_through_accelerates_hooks_with_an_offloaded_layer(tmp_path):
    """A layer offloaded to disk has its weights on the meta device until its accelerate hook brings them in:
    the slim verifier must enter the layer through that hook (as it does each GPU's layers)."""
    from accelerate import dispatch_model

    model = build("qwen2")
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = model(ids).logits
    routed = SlimVerifier(model, resolve_route(["attn.1"], 4))(ids).logits
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "disk", "model.layers.3": "cpu", "model.norm": "cpu",
                  "lm_head": "cpu"}
    dispatch_model(model, device_map=device_map, offload_dir=str(tmp_path))
    assert model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    for route, want in ((["attn.1"], routed), ("none", expected)):
        slim = SlimVerifier(model, resolve_route(route, 4))
        cache = DynamicCache()
        got = torch.cat([slim(ids[:, :7], past_key_values=cache).logits, slim(ids[:, 7:], past_key_values=cache).logits], 1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_gpu_check_runs_its_decode_loop_tiny_on_cpu(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "check.json"
    assert gpu_check.main(["--cpu-smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    decode = result["decode"]
    assert set(decode["methods"]) == {"ar", "sd", "via", "via_own_cache", "via_separate", "via_lossless"}
    assert all(m["new_tokens"] == decode["max_new_tokens"] for m in decode["methods"].values())
    assert decode["sd_equals_ar"]["equal"] is True  # fp32 on CPU: exact
    assert decode["lossless_equals_sd"]["equal"] is True and decode["progressive_equals_separate"]["equal"] is True
    assert result["ms"]["full"] and result["errors"] == []


def test_progressive_via_equals_separate_passes_and_lossless_equals_sd_on_int4_with_long_catch_ups(pair):
    """Drafts of 64, no bound on unverified runs: the verifiers' passes over their caches exceed 64 rows; with row
    attention every row is still computed as a one-token step, so sharing the trunk (with the slim view's own cache
    after it) changes nothing, under the draft signal and the slim one, and everything in tier C is plain SD."""
    from via_sd import Thresholds

    rows = []
    run = pair.slim.run
    pair.slim.run = lambda h, start, *a, **k: rows.append((start, h.shape[1])) or run(h, start, *a, **k)
    try:
        prompt = "Once upon a time"
        runs = {}
        for signal, thresholds in (("draft", Thresholds(accept=0.7, escalate=0.4, signal="draft")),
                                   ("slim", Thresholds.preset("paper"))):
            common = dict(gamma=64, max_new_tokens=120, temperature=0.0, max_unverified=0, thresholds=thresholds)
            runs[signal] = [generate(pair, prompt, "via", DecodeConfig(**common, progressive=True, slim_cache="own")),
                            generate(pair, prompt, "via", DecodeConfig(**common, progressive=False))]
        catch_ups = [n for start, n in rows if start > 0]
        greedy = dict(gamma=64, max_new_tokens=140, temperature=0.0)
        sd = generate(pair, prompt, "sd", DecodeConfig(**greedy))
        lossless = generate(pair, prompt, "via", DecodeConfig(**greedy, thresholds=Thresholds.preset("lossless")))
    finally:
        del pair.slim.run
    assert max(catch_ups) > 64
    for progressive, separate in runs.values():
        assert progressive.token_ids == separate.token_ids and len(progressive.token_ids) == 120
        assert progressive.summary["tier_counts"] == separate.summary["tier_counts"]
    assert runs["draft"][0].summary["tier_counts"]["slim"] >= 5  # the slim verifier decided tokens itself
    assert lossless.token_ids == sd.token_ids
    progressive = runs["draft"][0]
    # every token the full verifier decided is its one-token-step argmax there (a wrong long pass would not be)
    prompt_ids = pair.encode(prompt)
    with torch.inference_mode():
        cache, seq = DynamicCache(), prompt_ids + progressive.token_ids
        logits = [pair.verifier(torch.tensor([prompt_ids]), past_key_values=cache).logits[0, -1]]
        logits += [pair.verifier(torch.tensor([[t]]), past_key_values=cache).logits[0, -1] for t in seq[len(prompt_ids):-1]]
    full = [t for t in progressive.tokens if t["tier"] == "full"]
    assert len(full) >= 10 and all(t["id"] == int(logits[t["i"]][:VOCAB].argmax()) for t in full)


def test_passes_that_extend_a_cache_are_marked_for_the_low_bit_kernels(pair):
    """row_attention.EXTENDING is True exactly while a forward extends a cache (the verifier called as a HF model
    and the slim verifier alike), so a low-bit linear can keep its per-row kernel there whatever the row count."""
    from via_sd.weights.row_attention import EXTENDING

    seen = []
    probe = pair.verifier.model.layers[1].mlp.down_proj
    handle = probe.register_forward_pre_hook(lambda _m, _a: seen.append(EXTENDING.get()))
    ids = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(7))
    try:
        for forward in (pair.verifier, SlimVerifier(pair.verifier, Route("none", (), 4))):
            cache = DynamicCache()
            forward(ids[:, :8], past_key_values=cache)
            forward(ids[:, 8:], past_key_values=cache)
        TeacherForced(pair.verifier, Calibration([ids[0].tolist()], [4]))
    finally:
        handle.remove()
    assert seen == [False, True, False, True, False] and not EXTENDING.get()

