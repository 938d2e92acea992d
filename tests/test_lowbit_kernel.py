"""The project's int4 / int8 kernel (via_sd/weights/lowbit_kernel.cpp): one arithmetic on every instruction set,
each row on its own, close to the de-quantized fp32 product and to torch's kernel, and torch's kernel where it
cannot run."""

import pytest
import torch

from via_sd.weights import lowbit_kernel
from via_sd.weights.linears import Int4Linear, Int6Linear, Int8Linear
from via_sd.weights.machine import cpu_name

pytestmark = pytest.mark.skipif(not lowbit_kernel.available(), reason=f"kernel not built: {lowbit_kernel.why_not()}")

# (outputs, inputs): the embedded pair's input widths (896, 1536 drafter / verifier hidden; 4864, 8960 their MLPs),
# a slice of outputs each (tiles of 16 outputs are computed independently), and odd small shapes
SHAPES = [(256, 896), (256, 1536), (128, 4864), (128, 8960), (16, 32), (48, 96), (272, 160)]
ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 16]


def _layers(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[:, :32] *= 8  # a group with larger weights than the rest, as real layers have
    w[16:32] *= 1e-3  # a tile whose super-block scales are fp16 subnormals
    w[32:48, 32:64] = 0  # groups of zeros
    return w, Int4Linear.from_float(w, tiles=True), Int8Linear.from_float([w], tiles=True)


def int6_layer(n, k, seed=0):
    """A Q6_K-like layer: random 6-bit codes, int8 sub-scales per 16 inputs times an fp16 scale per 256 (some of
    them subnormal), or None where the shape is not whole super-blocks."""
    if k % 256:
        return None
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 64, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 256, generator=g) * 2e-3).half()
    d[: n // 4] *= 1e-3  # fp16 subnormals
    sc = torch.randint(-128, 128, (n, k // 16), generator=g).float()
    return Int6Linear.from_codes([(q, d.float().repeat_interleave(16, 1) * sc)])


@pytest.mark.parametrize("n,k", SHAPES)
def test_every_instruction_set_gives_the_same_bits_and_each_row_its_own(n, k):
    _, int4, int8 = _layers(n, k)
    int6 = int6_layer(n, k)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(1))
    x[:, 5] *= 30  # an outlier channel, as residual streams have
    paths = range(lowbit_kernel.isa() + 1)  # generic, AVX2, AVX-512 VNNI: those this CPU runs
    for rows in ROWS:
        xs = x[:rows].contiguous()
        y4 = [lowbit_kernel.int4_mm(xs, int4.packed, int4.scales, p) for p in paths]
        y8 = [lowbit_kernel.int8_mm(xs, int8.weight, int8.scale, p) for p in paths]
        assert all(torch.equal(y, y4[0]) for y in y4) and all(torch.equal(y, y8[0]) for y in y8), rows
        assert torch.equal(y4[0][rows - 1:], int4(x[rows - 1:rows])), rows  # the last row, alone
        assert torch.equal(y8[0][rows - 1:, :n], int8(x[rows - 1:rows])), rows
        if int6 is not None:
            y6 = [lowbit_kernel.int6_mm(xs, int6.weight, int6.scales, p) for p in paths]
            assert all(torch.equal(y, y6[0]) for y in y6), rows
            assert torch.equal(y6[0][rows - 1:], int6(x[rows - 1:rows])), rows


@pytest.mark.parametrize("n,k", SHAPES)
def test_the_kernel_is_close_to_fp32_and_to_torchs_kernel(n, k):
    """Tolerance: activations become int8 per group of 32 (steps of 1/127 of the group's largest value), so the
    product is within ~1% of the de-quantized fp32 product in norm; torch's kernel (bf16 activations) as close."""
    w, int4, int8 = _layers(n, k)
    torch4 = Int4Linear.from_float(w, tiles=False)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    int6 = int6_layer(n, k)
    for layer, reference in ((int4, x @ int4.dequantize().T), (int8, x @ int8.dequantize().T),
                             (int4, torch4(x)), *(() if int6 is None else ((int6, x @ int6.dequantize().T),))):
        assert (layer(x) - reference).norm() <= 1e-2 * reference.norm()
    top = (x @ w.T).argmax(-1)
    assert (int4(x).argmax(-1) == top).float().mean() >= 0.75  # random weights: near-ties are common


def test_torchs_kernel_serves_where_the_project_kernel_cannot_load(monkeypatch):
    """VIA_SD_KERNEL=torch (as where the build fails): layers take torch's layout and kernels, greedy SD still
    equals AR, and the trace says which kernel ran."""
    from via_sd import DecodeConfig, generate, load_pair
    from via_sd.weights.linears import kernel_rule

    saved = dict(lowbit_kernel._state)
    monkeypatch.setenv("VIA_SD_KERNEL", "torch")
    lowbit_kernel._state.clear()
    try:
        assert not lowbit_kernel.available() and "VIA_SD_KERNEL=torch" in kernel_rule()
        assert Int4Linear.from_float(torch.randn(32, 64)).layout == "torch"
        pair = load_pair("random", weights="int4")
        assert {m.layout for m in pair.verifier.modules() if isinstance(m, Int4Linear)} == {"torch"}
        ar = generate(pair, "abc", "ar", DecodeConfig(max_new_tokens=12))
        sd = generate(pair, "abc", "sd", DecodeConfig(gamma=3, max_new_tokens=12))
        assert sd.text == ar.text and ar.models["kernels"].startswith("torch's int4/int8 kernels (VIA_SD_KERNEL")
    finally:
        lowbit_kernel._state.clear()
        lowbit_kernel._state.update(saved)
    assert lowbit_kernel.available()


def test_layers_built_with_the_kernel_off_are_named_by_what_they_run():
    from via_sd.weights.linears import kernel_rule

    with lowbit_kernel.off():
        layer = Int4Linear.from_float(torch.randn(32, 64))
    assert layer.layout == "torch" and kernel_rule(layer).startswith("torch's int4/int8 kernels")
    assert kernel_rule(Int4Linear.from_float(torch.randn(32, 64))).startswith("via_sd q8-activation")


def test_the_breakdown_script_prints_the_roofline_the_parts_and_both_kernels_curves(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "kernel_breakdown.py"
    spec = importlib.util.spec_from_file_location("kernel_breakdown", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--preset", "random", "--steps", "2", "--context", "16", "--rows", "1,3",
                        "--linear", "64x96", "--bandwidth-mib", "64"]) == 0
    out = capsys.readouterr().out
    assert "| memory read, " in out and "MiB, bandwidth.cpp) | " in out and "| low-bit linears |" in out
    assert "| int8 dot products, " in out and "G products/s |" in out and "the products outweigh the reads past k = " in out
    assert "GOP/s" in out and "| attention sub-layer: int4 " in out and "| MLP sub-layer: int4 " in out
    assert "64x96 int4" in out and "| 3 | " in out
    assert "| **one step** |" in out and "| 3 |" in out and "via_sd q8-activation" in out
    assert "of bandwidth: of the read probe's median, " in out and "over 6 reads before, between and after 5 blocks" in out
    assert out.startswith(f"{cpu_name()}; ATen CPU capability ")  # which machine the figures are of


def test_the_bandwidth_probe_reads_every_byte_of_every_threads_share():
    """bandwidth.cpp's loads feed its checksum, so none can be dropped: one byte set anywhere (either thread's
    share) changes it, at each load width this CPU runs."""
    kernel, buffer = lowbit_kernel.module(), torch.zeros(1 << 20, dtype=torch.uint8)
    for wide in [False, True][: 1 + (lowbit_kernel.isa() == 2)]:
        assert kernel.stream_read(buffer, wide) == 0
        for at in (0, (1 << 19) + 77, (1 << 20) - 1):
            buffer[at] = 0x10
            assert kernel.stream_read(buffer, wide) != 0, (wide, at)
            buffer[at] = 0


def test_the_dot_product_probe_counts_the_products_of_every_thread():
    """bandwidth.cpp's dot_peak: twelve chains of the kernel's product instruction a round on each thread (64 byte
    products for AVX-512 VNNI, 32 for AVX2's three-instruction product): products / seconds is the peak."""
    kernel, threads = lowbit_kernel.module(), torch.get_num_threads()
    for vnni in [False, True][: lowbit_kernel.isa()]:
        assert kernel.dot_peak(1000, vnni) == threads * 1000 * 12 * (64 if vnni else 32)


def test_a_call_too_large_for_the_kept_buffer_gives_each_row_its_own_bits():
    """Above 4M activation values (a long prompt) a call quantizes into a buffer of its own, in parallel; each row
    still gets the bits it gets alone (kept buffer), on every path."""
    _, int4, int8 = _layers(32, 32)
    int6 = int6_layer(16, 256)
    x = torch.randn((1 << 17) + 9, 32, generator=torch.Generator().manual_seed(3))
    x6 = torch.randn((1 << 14) + 9, 256, generator=torch.Generator().manual_seed(4))
    some = [0, 1, 16000, x6.shape[0] - 1]
    for path in range(lowbit_kernel.isa() + 1):
        y4 = lowbit_kernel.int4_mm(x, int4.packed, int4.scales, path)
        y8 = lowbit_kernel.int8_mm(x, int8.weight, int8.scale, path)
        y6 = lowbit_kernel.int6_mm(x6, int6.weight, int6.scales, path)
        for r in some:
            assert torch.equal(y4[r], lowbit_kernel.int4_mm(x[r:r + 1].contiguous(), int4.packed, int4.scales, 0)[0])
            assert torch.equal(y8[r], lowbit_kernel.int8_mm(x[r:r + 1].contiguous(), int8.weight, int8.scale, 0)[0])
            assert torch.equal(y6[r], lowbit_kernel.int6_mm(x6[r:r + 1].contiguous(), int6.weight, int6.scales, 0)[0])


def test_one_call_over_mixed_parts_gives_each_layers_bits_with_its_bias_and_the_residual_added():
    """A layer's q (int4), k (int4), v (Q6_K) and an int8 part side by side in one call, biases and a residual added
    in the kernel: every column is the bits of that layer alone, then `+ bias`, then `h +`, as torch adds them."""
    k = 512
    _, q, _ = _layers(64, k, seed=3)
    _, kk, int8 = _layers(32, k, seed=4)
    v = int6_layer(48, k, seed=5)
    layers = [q, kk, v, int8]
    g = torch.Generator().manual_seed(6)
    bias = torch.randn(64 + 32 + 48 + 32, generator=g)
    for rows in (1, 3, 8, 9):
        x = torch.randn(rows, k, generator=g)
        h = torch.randn(rows, bias.numel(), generator=g)
        bare = torch.cat([layer(x) for layer in layers], 1)  # no biases yet
        assert torch.equal(lowbit_kernel.tiles_mm(x, lowbit_kernel.parts(layers)), bare)
        for layer, b in zip(layers, bias.split([layer.out_features for layer in layers])):
            layer.bias = torch.nn.Parameter(b.clone(), requires_grad=False)
        for path in range(lowbit_kernel.isa() + 1):
            assert torch.equal(lowbit_kernel.tiles_mm(x, lowbit_kernel.parts(layers), path=path), bare + bias), path
            assert torch.equal(lowbit_kernel.tiles_mm(x, lowbit_kernel.parts(layers), h, path=path), h + (bare + bias))
        assert torch.equal(torch.cat([layer(x) for layer in layers], 1), bare + bias)  # each layer's forward too
        for layer in layers:
            layer.bias = None
    padded = Int8Linear.from_float([torch.randn(40, k, generator=g)], tiles=True)  # 40 outputs: a padded last tile
    with pytest.raises(ValueError, match="does not run on the project's kernel"):
        lowbit_kernel.parts([q, padded])


def test_rope_cache_writes_and_attention_in_one_call_give_the_bits_of_the_steps_in_torch():
    heads, kv_heads, dim, past, rows = 4, 2, 16, 5, 3
    g = torch.Generator().manual_seed(7)
    y = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=g)
    cos, sin = torch.randn(rows, dim, generator=g), torch.randn(rows, dim, generator=g)
    keys, values = torch.randn(1, 16, kv_heads, dim, generator=g), torch.randn(1, 16, kv_heads, dim, generator=g)
    k2, v2 = keys.clone(), values.clone()
    a = lowbit_kernel.rope_attention(y, cos, sin, keys, values, past, heads, dim ** -0.5)
    qkv = y.view(1, rows, heads + 2 * kv_heads, dim)
    qk = qkv[:, :, :heads + kv_heads]
    qk = qk * cos[None, :, None] + qk.roll(dim // 2, -1) * sin[None, :, None]
    k2[:, past:past + rows], v2[:, past:past + rows] = qk[:, :, heads:], qkv[:, :, heads + kv_heads:]
    end = past + rows
    expected = lowbit_kernel.causal_attention(qk[:, :, :heads].transpose(1, 2), k2[:, :end].transpose(1, 2),
                                              v2[:, :end].transpose(1, 2), dim ** -0.5)
    assert torch.equal(keys, k2) and torch.equal(values, v2)  # rows past the pass untouched, the pass's written
    assert torch.equal(a, expected)


def test_the_kernels_rms_norm_gives_torchs_bits():
    """lowbit_kernel.rms_norm: ATen's composite (x * x, ATen's own sum, / H, + eps, rsqrt, * x, * w) in one call."""
    g = torch.Generator().manual_seed(8)
    for width in (64, 96, 896, 1536, 8960):
        weight = torch.randn(width, generator=g)
        for rows in (1, 2, 5, 9, 33):
            x = torch.randn(1, rows, width, generator=g) * torch.rand(1, rows, 1, generator=g) * 10
            x[..., 3] *= 50  # an outlier channel
            assert torch.equal(lowbit_kernel.rms_norm(x, weight, 1e-6), torch.rms_norm(x, (width,), weight, 1e-6))


def test_a_calls_chunks_shared_by_any_number_of_threads_give_the_bits_of_one():
    """tiles_mm hands each thread a run of the call's chunks and lets a thread out of work take the last chunks of
    another's (run_chunks): with 1 to 5 threads on this machine's cores (more threads than cores: they are
    descheduled mid-run, so chunks are taken from others), every tile is computed, once, into its own outputs."""
    _, q, _ = _layers(2048, 1536, seed=9)  # 128 tiles of 48 groups: 12 KB of codes a tile, ~50 chunks
    v = int6_layer(1024, 1536, seed=10)
    layers = lowbit_kernel.parts([q, v])
    g, threads = torch.Generator().manual_seed(11), torch.get_num_threads()
    try:
        for rows in (1, 8):
            xs = [torch.randn(rows, 1536, generator=g) for _ in range(3)]
            torch.set_num_threads(1)
            alone = [lowbit_kernel.tiles_mm(x, layers) for x in xs]
            for n in (2, 3, 5):
                torch.set_num_threads(n)
                for _ in range(4):
                    for x, y in zip(xs, alone):  # a chunk left out would hold another input's outputs, or garbage
                        assert torch.equal(lowbit_kernel.tiles_mm(x, layers), y), (rows, n)
    finally:
        torch.set_num_threads(threads)
