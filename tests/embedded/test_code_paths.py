"""The same bits on every x86 machine, proven on one: the embedded pair under every code path this CPU can be
forced to take (ATen's capability, MKL's branch, oneDNN's ISA, the kernel's instruction set) gives the golden
tokens and q_full / p_draft bits that assets/golden/embedded.jsonl recorded (scripts/golden.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import golden  # noqa: E402

pytestmark = pytest.mark.embedded

ROOT = Path(__file__).resolve().parents[2]
# Each process forces one setting of every library at once (a process per value would cost minutes of loading):
# a library that mattered would change the bits. The kernel's own paths are forced on a tiny int4 pair
# (tests/test_fixed_order.py) and at every width (tests/test_lowbit_kernel.py): here the generic path would take
# minutes a token, and another path would re-measure the pair's cost profile, which names the kernel's path.
FORCED = {
    "ATen default, MKL compatible, oneDNN AVX2":
        {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_VERBOSE": "1"},
    "ATen AVX-512, MKL AVX-512, oneDNN AVX-512":
        {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
NEAR_TIE = 2  # the golden prompt whose fourth token is a near-tie: a changed summation order shows there first


def test_this_machine_reproduces_the_golden_tokens_and_bits(embedded_pair):
    results = golden.check(embedded_pair)
    assert len(results) == len(golden.CASES)
    assert [r for r in results if not (r["tokens"] and r["bits"])] == []


@pytest.mark.parametrize("name", list(FORCED))
def test_every_forced_code_path_gives_the_golden_bits(name):
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")}
    env.update(FORCED[name])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "golden.py"), "check", "--only", str(NEAR_TIE)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "3 of 3 runs equal" in out.stdout
    if "MKL_VERBOSE" in FORCED[name]:  # MKL logs every call it serves: loading and decoding made none
        assert "MKL_VERBOSE SGEMM" not in out.stdout
        probe = subprocess.run([sys.executable, "-c", "import torch; torch.ones(8, 8) @ torch.ones(8, 8)"],
                               env=env, capture_output=True, text=True, cwd=ROOT)
        assert "MKL_VERBOSE SGEMM" in probe.stdout  # the log works: one fp32 matmul outside our forward shows


def test_a_torch_operation_before_via_sd_on_another_code_path_is_refused():
    code = "import torch; torch.ones(64).sum(); import via_sd"
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "CodePathError" in out.stderr and "import via_sd before" in out.stderr
    out = subprocess.run([sys.executable, "-c", "import torch; import via_sd; print(torch.backends.cpu."
                          "get_cpu_capability())"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "AVX2"  # torch imported first is fine: ATen reads late
