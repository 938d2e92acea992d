"""The fixed-order forward (via_sd/weights/numerics.py, attention.cpp): one order of arithmetic whatever the code
path, on small inputs and a tiny int4 pair; tests/embedded/test_code_paths.py does the same on the real pair."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from via_sd.weights import lowbit_kernel

ROOT = Path(__file__).resolve().parents[1]
built = pytest.mark.skipif(not lowbit_kernel.available(), reason=f"no kernel: {lowbit_kernel.why_not()}")

SHAPES = [(12, 2, 1, 300, 128), (12, 2, 7, 300, 128), (12, 2, 40, 40, 128), (14, 2, 5, 37, 64), (4, 4, 3, 10, 12),
          (6, 3, 4, 50, 200)]


@built
@pytest.mark.parametrize("heads, kv_heads, rows, keys, dim", SHAPES)
def test_attention_is_sdpa_in_one_order_whatever_the_path_and_the_rows(heads, kv_heads, rows, keys, dim):
    g = torch.Generator().manual_seed(rows * keys)
    q, k, v = (torch.randn(1, h, n, dim, generator=g) for h, n in ((heads, rows), (kv_heads, keys), (kv_heads, keys)))
    causal = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=dim ** -0.5, enable_gqa=True)
    kernel = lowbit_kernel.module()
    paths = [kernel.causal_attention(q, k, v, dim ** -0.5, path) for path in range(min(lowbit_kernel.isa(), 2) + 1)]
    assert all(torch.equal(paths[0], other) for other in paths[1:])  # generic, AVX2 and (where it runs) AVX-512
    torch.testing.assert_close(paths[1], reference.transpose(1, 2), atol=2e-6, rtol=1e-5)
    for r in range(rows):  # each row, alone, as its one-token step computes it
        seen = keys - rows + r + 1
        alone = kernel.causal_attention(q[:, :, r:r + 1], k[:, :, :seen], v[:, :, :seen], dim ** -0.5, len(paths) - 1)
        assert torch.equal(alone[:, 0], paths[0][:, r])


DIGEST = """
import hashlib, json
from via_sd import DecodeConfig, generate, load_pair
pair = load_pair("random", weights="int4")
runs = [generate(pair, "a quick brown fox", method=m, config=DecodeConfig(max_new_tokens=24, seed=0, gamma=4))
        for m in ("ar", "sd", "via")]
bits = [[r.token_ids, [[t["q_full"], t["q_slim"], t["p_draft"]] for t in r.tokens]] for r in runs]
print(json.dumps({"digest": hashlib.sha256(json.dumps(bits).encode()).hexdigest(), "kernels": pair.kernels()}))
"""
# MKL is left alone here: the tiny pair's head (a 98-token vocabulary, not whole tiles) stays an fp32 nn.Linear, MKL's;
# the embedded pair has no such layer, and its test forces MKL's branches and finds no MKL call at all.
FORCED = {"kernel generic, ATen default, oneDNN AVX2": {"VIA_SD_KERNEL": "generic", "ATEN_CPU_CAPABILITY": "default",
                                                       "ONEDNN_MAX_CPU_ISA": "AVX2"},
          "kernel AVX2, ATen AVX-512": {"VIA_SD_KERNEL": "avx2", "ATEN_CPU_CAPABILITY": "avx512"},
          "kernel at its best, oneDNN AVX-512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}


def _digest(env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                                                             "VIA_SD_KERNEL")} | env | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@built
def test_a_tiny_int4_pair_gives_the_same_bits_on_every_forced_code_path():
    """Tokens and every probability of AR, SD and VIA-SD, bit for bit, across the kernel's three paths, ATen's
    capabilities and oneDNN's ISA (each process its own choice, fixed at its start); torch's own
    kernels, another arithmetic, give other bits (so the check can fail)."""
    runs = {name: _digest(env) for name, env in FORCED.items()}
    assert len({r["digest"] for r in runs.values()}) == 1, runs
    kernels = [r["kernels"] for r in runs.values()]
    assert "generic" in kernels[0] and "AVX2;" in kernels[1] and all("ATen AVX2" in k for k in kernels), kernels
    assert _digest({"VIA_SD_KERNEL": "torch"})["digest"] != runs[next(iter(runs))]["digest"]


def test_attention_stays_sdpa_where_the_weights_are_not_the_kernels():
    """fp32 weights (the random preset) keep torch's SDPA: their matmuls are MKL's anyway."""
    from via_sd.weights.row_attention import fixed_order_attention

    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 5, 16)
    assert fixed_order_attention(q, k, k, 0.25, torch.nn.Linear(64, 64)) is None
