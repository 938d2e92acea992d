"""Low-bit weights: GGUF blocks -> codes, the int4 linear, the weights= settings on a tiny model.

GGUF data is real: blocks made by the `gguf` package's own quantizers (Q4_0 ... Q8_0), or valid
random blocks for the K-quants it cannot make (every byte pattern of the codes is legal), checked
against the package's reference de-quantizer; models are written to GGUF files with GGUFWriter under the tensor
names transformers maps (`model_gguf`) and read back through gguf_pack.Entries.
"""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from via_sd import DecodeConfig, Trace, generate, load_pair
from via_sd.weights.gguf_pack import Entries, UnsupportedTensorType, decompose
from via_sd.weights import lowbit_kernel
from via_sd.weights.settings import Int4Linear, Int6Linear, Int8Linear, LowbitEmbedding, RescoredHead, quantize_int4, resolve_weights

ROWS, COLS = 64, 512
GREEDY = DecodeConfig(gamma=4, max_new_tokens=24)


def k_quant_blocks(kind: str, rows=ROWS, cols=COLS, seed=0) -> np.ndarray:
    """Valid random Q4_K / Q5_K / Q6_K rows: random codes and sub-scales, sane fp16 super-scales."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    b = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-4, 2e-3, size=(b.shape[0], 2)).astype(np.float16).view(np.uint8)
    if kind == "Q6_K":  # ... int8 sub-scales, then d at the end
        b[:, -2:] = scales[:, :2]
    else:  # d, dmin first
        b[:, :4] = scales
    return b.reshape(rows, -1)


def blocks_of(kind: str) -> np.ndarray:
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        return k_quant_blocks(kind)
    w = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32) * 0.05
    return quantize(w, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_each_supported_block_type_unpacks_to_the_gguf_reference_values(kind):
    raw = blocks_of(kind)
    codes = decompose(raw, kind, (ROWS, COLS))
    reference = dequantize(raw, GGMLQuantizationType[kind]).reshape(ROWS, COLS)
    assert codes.codes.max() < 2 ** codes.bits
    assert np.array_equal(codes.dequantize(), reference)  # bit for bit


def write_gguf(path, tensors: dict):
    writer = GGUFWriter(str(path), "llama")
    for name, (array, kind) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=None if kind is None else GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def qwen2_config(**kw):
    from transformers import Qwen2Config

    args = dict(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=4, tie_word_embeddings=False)
    return Qwen2Config(**{**args, **kw})


def model_gguf(path, config, kinds: dict[str, str], seed: int = 0) -> dict[str, torch.Tensor]:
    """Writes a random `config` (qwen2) model to the GGUF `path` under the tensor names transformers maps to it: the
    tensors named in `kinds` (transformers' names) as valid random blocks of that type, the rest F32. Returns
    {name: the gguf package's de-quantized values} of the quantized ones."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    with init_empty_weights():
        skeleton = AutoModelForCausalLM.from_config(config)
    gguf_name = {hf: name for name, hf in get_gguf_hf_weights_map(skeleton, TensorProcessor(config=config.to_dict())).items()}
    writer, reference, g = GGUFWriter(str(path), "qwen2"), {}, torch.Generator().manual_seed(seed)
    for i, (name, param) in enumerate(skeleton.named_parameters()):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if name in kinds:
            raw = k_quant_blocks(kinds[name], rows=param.shape[0], cols=param.shape[1], seed=seed + i)
            writer.add_tensor(gguf_name[name], raw, raw_dtype=GGMLQuantizationType[kinds[name]])
            reference[name] = torch.from_numpy(dequantize(raw, GGMLQuantizationType[kinds[name]]).reshape(param.shape))
        else:
            writer.add_tensor(gguf_name[name], (torch.randn(param.shape, generator=g) * 0.02).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return reference


def test_a_gguf_model_reads_back_by_transformers_names_whole_in_chunks_and_row_by_row(tmp_path):
    config = qwen2_config(vocab_size=96)
    kinds = {"model.layers.0.mlp.up_proj.weight": "Q4_K", "model.layers.0.mlp.down_proj.weight": "Q6_K",
             "lm_head.weight": "Q6_K", "model.embed_tokens.weight": "Q5_K"}
    reference = model_gguf(tmp_path / "m.gguf", config, kinds)
    entries = Entries.from_gguf(tmp_path / "m.gguf", config)
    assert "lm_head.weight" in entries.keys() and "model.layers.0.self_attn.q_proj.bias" in entries.keys()
    assert len(entries.keys()) == 15  # every parameter of the one-layer qwen2, its q / k / v biases too
    for name, kind in kinds.items():
        assert entries.is_codes(name) and entries.type(name) == kind
        assert torch.equal(entries.dequantize(name), reference[name])
        chunks = entries.chunks(name, 32)
        assert len(chunks) == -(-entries.shape(name)[0] // 32)
        assert torch.equal(torch.cat([entries.float(name, rows) for rows in chunks]), reference[name])
    norm = entries.float("model.norm.weight")
    assert norm.shape == (256,) and not entries.is_codes("model.norm.weight")
    ids = torch.tensor([[3, 60], [0, 95]])  # the head's rows, de-quantized on demand from the mapped blocks
    assert torch.equal(entries.exact_rows("lm_head.weight")(ids), reference["lm_head.weight"][ids])


def test_an_unsupported_gguf_tensor_type_is_an_error_naming_type_tensor_and_file(tmp_path):
    path = tmp_path / "odd.gguf"
    config = qwen2_config()
    writer = GGUFWriter(str(path), "qwen2")
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q2_K]
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((256, 256 // block * nbytes), np.uint8),
                      raw_dtype=GGMLQuantizationType.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedTensorType) as err:
        Entries.from_gguf(path, config)
    assert "Q2_K" in str(err.value) and str(path) in str(err.value) and "blk.0.ffn_up.weight" in str(err.value)


@pytest.mark.parametrize("tiles", [True, False], ids=["project-kernel", "torch-kernel"])
def test_int4_linear_equals_the_dequantized_fp32_linear(tiles):
    if tiles and not lowbit_kernel.available():
        pytest.skip(f"the project's kernel is not built here: {lowbit_kernel.why_not()}")
    torch.manual_seed(0)
    w, b = torch.randn(192, 256) * 0.05, torch.randn(192)
    layer = Int4Linear.from_float(w, b, tiles=tiles)
    assert layer.layout == ("tiles" if tiles else "torch")
    x = torch.randn(3, 7, 256)
    dense = layer.dequantize()
    # Q4_K's grid: each weight within half a step of the group's min / max grid, plus what putting the scale and
    # the min on their super-block's grid (fp16 d times 6 bits) moved them; torch's layout: the bf16 rounding of
    # the scale and of the zero too
    q, scale, offset = quantize_int4(w)
    lo, hi = torch.aminmax(w.view(192, -1, 32), dim=-1)
    lo = lo.clamp(max=0)
    moved = (offset - lo).abs() + 15 * (scale - (hi - lo) / 15).abs()
    step, offset, moved = (t.repeat_interleave(32, 1) for t in (scale, offset, moved))
    assert ((dense - w).abs() <= 0.5 * step + moved + (0 if tiles else 2 ** -8 * (16 * step + offset.abs()))).all()
    if tiles:  # the layout holds them exactly
        assert torch.equal(dense, q.float() * step + offset)
    y = layer(x)
    assert y.shape == (3, 7, 192) and y.dtype == torch.float32
    if tiles:  # activations as int8 per group of 32 (127 steps of the group's largest): ~0.5% of the output
        reference = x @ dense.t() + b
        assert (y - reference).norm() <= 1e-2 * reference.norm()
    else:  # the kernel reads activations as bf16 and returns bf16 (8 significant bits): 1% of the largest output
        reference = x.bfloat16().float() @ dense.t() + b
        assert (y - reference).abs().max() <= 1e-2 * reference.abs().max()


def test_q4_k_weights_become_int4_exactly(tmp_path):
    from via_sd.weights.gguf_pack import build_model

    config = qwen2_config(tie_word_embeddings=True)
    name = "model.embed_tokens.weight"
    reference = model_gguf(tmp_path / "m.gguf", config, {name: "Q4_K"})[name]
    entries = Entries.from_gguf(tmp_path / "m.gguf", config)
    model = build_model(config, entries, "int4")
    head, embed = model.lm_head.head, model.model.embed_tokens
    assert isinstance(model.lm_head, RescoredHead) and isinstance(head, Int4Linear)  # the head tied to the embedding
    assert isinstance(embed, LowbitEmbedding)
    assert torch.equal(embed(torch.arange(64)), reference)  # the embedding keeps the GGUF codes as they are
    if head.layout == "tiles":  # the project's layout holds Q4_K exactly: the gguf package's own de-quantized values
        assert torch.equal(head.dequantize(), reference)
        return
    codes = entries.codes(name)
    scale = torch.from_numpy(codes.scale).repeat_interleave(32, 1)
    offset = torch.from_numpy(codes.offset).repeat_interleave(32, 1)
    bound = 2 ** -8 * (8 * scale + torch.maximum((offset + 8 * scale).abs(), offset.abs()))
    # torch's layout: same codes; scale and zero rounded to bf16
    assert ((head.dequantize() - reference).abs() <= bound).all()


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_blocks_rearranged_into_tiles_hold_the_values_the_search_finds(kind):
    """tiles.q4k_tiles / q6k_tiles move a GGUF's bytes into the kernel's layout: the same codes and the same
    scale and offset values as pack_int4 / pack_int6 give from the decomposed codes (which search d and c again)."""
    from via_sd.weights.tiles import pack_int4, pack_int6, q4k_tiles, q6k_tiles, unpack_int4, unpack_int6

    raw = k_quant_blocks(kind, rows=64, cols=1024, seed=3)
    c = decompose(raw, kind, (64, 1024))
    if kind == "Q4_K":
        got = q4k_tiles(torch.from_numpy(raw))
        searched = pack_int4(torch.from_numpy(c.codes), torch.from_numpy(c.scale), torch.from_numpy(c.offset))
        unpack = unpack_int4
    else:
        got = q6k_tiles(torch.from_numpy(raw), torch.from_numpy(c.codes))
        searched = pack_int6(torch.from_numpy(c.codes), torch.from_numpy(c.scale))
        unpack = unpack_int6
    assert torch.equal(got[0], searched[0])
    for a, b in zip(unpack(*got), unpack(*searched)):
        assert torch.equal(a, b)
    assert torch.equal(unpack(*got)[0], torch.from_numpy(c.codes))


def test_tiny_model_in_int4_keeps_greedy_sd_equal_to_greedy_ar():
    pair = load_pair("random", weights="int4")
    assert pair.weights == "int4"
    for model in (pair.drafter, pair.verifier):
        assert any(isinstance(m, Int4Linear) for m in model.modules())
        assert not any(type(m) is torch.nn.Linear and m.out_features % 16 == 0 for m in model.modules())
    prompt = "The quick brown fox"
    ar, sd = generate(pair, prompt, "ar", GREEDY), generate(pair, prompt, "sd", GREEDY)
    assert sd.token_ids == ar.token_ids and len(ar.token_ids) == GREEDY.max_new_tokens
    via = generate(pair, prompt, "via", GREEDY)  # the slim verifier runs the int4 modules too
    assert len(via.token_ids) == GREEDY.max_new_tokens


def test_slim_verifier_without_skips_equals_the_int4_verifier():
    pair = load_pair("random", weights="int4", route="none")
    ids = torch.tensor([pair.encode("hello there", chat=False)])
    with torch.inference_mode():
        assert torch.allclose(pair.slim(ids).logits, pair.verifier(ids).logits, atol=1e-5)


def test_weights_setting_is_recorded_in_every_trace():
    auto = load_pair("random")
    assert resolve_weights("auto", "cpu") == "int4" and resolve_weights("auto", "cuda") == "bf16"
    trace = generate(auto, "abc", "sd", DecodeConfig(gamma=2, max_new_tokens=4))
    assert trace.models["weights"] == "fp32" and trace.models["weights_requested"] == "auto"
    int4 = load_pair("random", weights="int4")
    trace = generate(int4, "abc", "ar", DecodeConfig(gamma=2, max_new_tokens=4))
    assert trace.models["weights"] == "int4" and len(trace.token_ids) == 4
    with pytest.raises(ValueError, match="int3"):
        load_pair("random", weights="int3")
    with pytest.raises(ValueError, match="'int8-dyn': choose one of auto, fp32, bf16, int4"):
        load_pair("random", weights="int8-dyn")  # dropped: torch deprecates its API, and it missed the 0.99 rule


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
def test_asking_for_cuda_without_one_is_a_clear_error_not_a_cpu_pair():
    for preset in ("random", "embedded"):
        with pytest.raises(ValueError, match="sees no CUDA device"):
            load_pair(preset, device="cuda")


def codes_model(folder, kinds: dict[str, str], exact_top1: bool = True):
    """A one-layer qwen2 whose tensors named in `kinds` are GGUF blocks of that type (random valid ones), the rest
    random floats; returns (the int4 model, {name: reference fp32 weight})."""
    from via_sd.weights.gguf_pack import build_model

    config, entries, reference = codes_entries(folder, kinds)
    return build_model(config, entries, "int4", exact_top1=exact_top1), reference


def codes_entries(folder, kinds: dict[str, str]):
    """(config, Entries, {name: reference fp32 weight}) of codes_model's one-layer qwen2, its GGUF in `folder`."""
    config = qwen2_config()
    path = folder / f"codes-{len(list(folder.glob('*.gguf')))}.gguf"
    reference = model_gguf(path, config, kinds)
    return config, Entries.from_gguf(path, config), reference


def test_kernel_fidelity_counts_the_top1_each_departure_from_the_gguf_values_moves(capsys, tmp_path):
    """benchmarks/kernel_fidelity.py on a one-layer model of Q4_K and Q6_K tensors: the exact variant agrees
    everywhere, and each emulated departure (and the kernel's model) is counted over every position."""
    from benchmarks import kernel_fidelity
    from via_sd.weights.gguf_pack import build_model

    config, entries, _ = codes_entries(tmp_path, {"model.layers.0.mlp.gate_proj.weight": "Q4_K",
                                        "model.layers.0.mlp.down_proj.weight": "Q6_K"})
    model = build_model(config, entries, "fp32")
    g = torch.Generator().manual_seed(5)
    refs = [(torch.randint(0, 64, (6,), generator=g).tolist(), torch.randint(0, 64, (10,), generator=g).tolist())
            for _ in range(3)]
    names = ["exact", "act32", "q4k_bf16", "q6k_int8", "kernel"]
    rows = kernel_fidelity.measure(model, entries, refs, names, config)
    assert [r["variant"] for r in rows] == names and all(r["positions"] == 30 for r in rows)
    assert rows[0]["agreement"] == 1.0 and all(0 <= r["agreement"] <= 1 for r in rows)
    x = torch.randn(4, 2, 32)  # int8 per group of 32: within half a step (max |v| / 254) of each group's values
    error = (kernel_fidelity.quantized_input(x.view(4, 64), 32).view(4, 2, 32) - x).abs().amax(-1)
    assert (error <= x.abs().amax(-1) / 254 * (1 + 1e-5)).all() and (error > 0).all()
    assert '"variant": "kernel"' in capsys.readouterr().out


def test_q6_k_tensors_stay_exact_other_wide_ones_become_int8_and_the_head_is_rescored_exactly(tmp_path):
    down, up, head = "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"
    model, reference = codes_model(tmp_path, {down: "Q6_K", head: "Q6_K", up: "Q5_K"})
    layer, x = model.model.layers[0].mlp.down_proj, torch.randn(5, 256)
    if lowbit_kernel.available():  # the project's kernel holds Q6_K as the file does: the gguf package's values
        assert isinstance(layer, Int6Linear) and torch.equal(layer.dequantize(), reference[down])
        exact = x @ reference[down].t()  # activations as int8 per group of 32: ~0.5% of the output
        assert (layer(x) - exact).norm() <= 1e-2 * exact.norm()
    else:
        assert isinstance(layer, Int8Linear)
    layer = model.model.layers[0].mlp.up_proj
    assert isinstance(layer, Int8Linear)
    w = reference[up]  # 5-bit values -> int8 per row: within half a step (+ the bf16 row scale)
    assert ((layer.dequantize() - w).abs().amax(1) <= w.abs().amax(1) * (1 / 254 + 2 ** -8)).all()
    exact = x.bfloat16().float() @ layer.dequantize().t()
    assert (layer(x) - exact).abs().max() <= 1e-2 * exact.abs().max()  # the kernel returns bf16
    # the head: int4 of 6-bit values ranks the vocabulary, its best 16 are re-scored from the codes
    assert isinstance(model.lm_head, RescoredHead) and isinstance(model.lm_head.head, Int4Linear)
    h = torch.randn(40, 256)
    logits, exact = model.lm_head(h), h @ reference[head].t()
    top = exact.topk(3, -1).indices
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    assert torch.allclose(logits.gather(-1, top), exact.gather(-1, top), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(model.lm_head.head(h), exact, atol=1e-3)  # which int4 alone would not be
    one_by_one = torch.cat([model.lm_head(h[i:i + 1]) for i in range(len(h))])
    assert torch.equal(one_by_one, logits)  # each row on its own, whatever the batch
    drafter, _ = codes_model(tmp_path, {down: "Q6_K", head: "Q6_K"}, exact_top1=False)  # a drafter: all int4, fastest
    assert isinstance(drafter.lm_head, Int4Linear) and isinstance(drafter.model.layers[0].mlp.down_proj, Int4Linear)


def test_int8_linear_equals_the_dequantized_fp32_linear_and_refuses_odd_widths():
    from via_sd.weights.settings import int8_shape_ok

    w, x = torch.randn(96, 512) * 0.05, torch.randn(7, 512)
    layer = Int8Linear.from_float([w[:64], w[64:]])
    assert ((layer.dequantize() - w).abs().amax(1) <= w.abs().amax(1) * (1 / 254 + 2 ** -8)).all()
    exact = x.bfloat16().float() @ layer.dequantize().t()
    assert (layer(x) - exact).abs().max() <= 1e-2 * exact.abs().max()
    assert torch.equal(layer(x[3:4]), layer(x)[3:4])  # a row's result does not depend on the batch
    assert int8_shape_ok(96, 512) and not int8_shape_ok(96, 100)  # torch's kernel crashes on such widths


def test_an_int4_verification_pass_computes_what_one_token_steps_compute_bit_for_bit():
    """Up to the output head (the tiny model's 97-token head is too narrow for the kernel and stays an
    fp32 matmul, whose result may depend on the batch; the embedded verifier's head is int4). The base model is
    called directly, so the pass is marked as extending the cache by hand, as the full model's hook marks it:
    batched SDPA differs from the steps by ~1e-9 here, which activations quantized in fp32 carry on (on the
    embedded verifier it moved logits by up to 0.125, BENCHMARKS.md); row attention brings it to 0."""
    from transformers import DynamicCache

    from via_sd.weights.row_attention import extending

    pair = load_pair("random", weights="int4", route="none")
    base = pair.verifier.base_model
    assert pair.verifier.config._attn_implementation == "via_sd_rows"
    prompt = torch.tensor([pair.encode("The quick brown fox jumps", chat=False)])
    new = torch.tensor([pair.encode("over the lazy", chat=False)])
    with torch.inference_mode():
        cache = DynamicCache()
        base(prompt, past_key_values=cache, use_cache=True)
        steps = torch.cat([base(new[:, i:i + 1], past_key_values=cache, use_cache=True).last_hidden_state[0]
                           for i in range(new.shape[1])])
        cache.crop(-new.shape[1])
        with extending():
            batch = base(new, past_key_values=cache, use_cache=True).last_hidden_state[0]
    assert new.shape[1] >= 6 and torch.equal(batch, steps)


def tiny_int4_llama(seed: int = 0):
    """A 2-layer Llama in int4 whose q/k/v and gate/up are whole 64-row blocks (so they can be fused)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from via_sd.weights.settings import apply_weights

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return apply_weights(AutoModelForCausalLM.from_config(config).eval(), "int4")


def test_fused_qkv_and_gate_up_give_the_separate_layers_outputs_bit_for_bit():
    import copy

    from transformers import DynamicCache

    from via_sd.weights.fused import FusedPart, fuse_linears

    model = tiny_int4_llama()
    fused = copy.deepcopy(model)
    assert fuse_linears(fused) == 4  # q/k/v and gate/up in each of 2 layers
    attn = fused.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, n), FusedPart) for n in ("q_proj", "k_proj", "v_proj"))
    assert attn.q_proj.fused is attn.v_proj.fused and attn.q_proj.fused.layer.out_features == 128 + 64 + 64
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    outputs = []
    for m in (model, fused):
        with torch.inference_mode():
            cache = DynamicCache()
            read = m(ids[:, :30], past_key_values=cache).logits
            steps = [m(ids[:, i:i + 1], past_key_values=cache).logits for i in range(30, 34)]
            extend = m(ids[:, 34:], past_key_values=cache).logits
        outputs.append([read, *steps, extend])
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    part = attn.q_proj.fused
    assert not part._calls  # no activations held between passes


def test_rescored_head_never_returns_a_token_it_did_not_rescore():
    """Constructed: exact re-scoring lowers all 16 best int4 logits below the int4 logit of the 17th;
    the 17th (never re-scored) must not win, nor any other token outside the 16."""
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    head = Int4Linear.from_float(w)
    h = torch.randn(3, 64)
    top16 = head(h).topk(16, -1).indices

    def exact_rows(ids):  # re-scored logit of every row: -50 (far below any int4 logit here)
        return -50 * h[:, None, :] / (h[:, None, :] ** 2).sum(-1, keepdim=True) + 0 * ids[..., None]

    rescored = RescoredHead(head, exact_rows)
    logits = rescored(h)
    assert all(int(logits[i].argmax()) in top16[i].tolist() for i in range(3))
    inside = logits.gather(-1, top16)
    assert torch.allclose(inside, torch.full_like(inside, -50.0), atol=1e-4)
    outside = logits.scatter(-1, top16, float("-inf"))
    assert (outside.amax(-1) < inside.amin(-1)).all()


def test_every_pass_takes_the_kernel_so_a_row_gets_the_same_bits_at_any_row_count(tmp_path, monkeypatch):
    """The rule fixed in code (int4.KERNEL_RULE): no row count switches the path, so each row of a long prompt read
    is what that row alone gives, on every machine; a kernel table an older version measured is never read."""
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path))
    (tmp_path / "lowbit-kernels.json").write_text('{"any machine": {"320x160": 32}}')  # the old timed table
    layer = Int4Linear.from_float(torch.randn(320, 160) * 0.05)
    x = torch.randn(600, 160)
    with torch.inference_mode():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(0, 600, 37)])
        for rows in (1, 37, 128, 600):
            assert torch.equal(layer(x[:rows])[::37], alone[: len(range(0, rows, 37))]), rows


def test_the_trace_names_the_kernel_rule_it_ran_under():
    from via_sd.weights.linears import kernel_rule

    pair = load_pair("random", weights="int4")
    trace = generate(pair, "abc", "sd", DecodeConfig(gamma=2, max_new_tokens=3))
    assert trace.models["kernels"] == kernel_rule()
    if lowbit_kernel.available():  # the project's kernel: the same bits on every x86 path, named
        assert kernel_rule().startswith("via_sd q8-activation") and lowbit_kernel.ISAS[lowbit_kernel.isa()] in kernel_rule()
    else:  # torch's kernels: their numbers depend on torch's version and the CPU capability
        assert torch.__version__ in kernel_rule() and torch.backends.cpu.get_cpu_capability() in kernel_rule()
    fp32 = generate(load_pair("random"), "abc", "sd", DecodeConfig(gamma=2, max_new_tokens=3))
    assert fp32.models["kernels"].startswith("torch float32 matmuls") and Trace.from_json(fp32.to_json()) == fp32
