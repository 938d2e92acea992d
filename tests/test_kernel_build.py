"""Building the int4 / int8 kernel (via_sd/weights/lowbit_kernel.py), each in a fresh Python: where `fcntl` is missing,
after a build killed midway, on a CPU whose ATen code path is pinned, when the compiler fails, and with old builds in
the cache."""

import html
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from via_sd.weights import lowbit_kernel

ROOT = Path(__file__).resolve().parent.parent
x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the kernel is x86 only")
built = pytest.mark.skipif(not lowbit_kernel.available(), reason=f"kernel not built: {lowbit_kernel.why_not()}")


def python(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter at the repository's root, with `env` over this one's; fails on error."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory):
    """The random pair run in a Python without `fcntl` (as on Windows: its import fails), on a new cache holding
    what a killed build and an older version leave: torch's `lock` file in the build folder, another build's folder.
    The build folder is a copy of the session's finished one (the load finds it up to date: no two-minute compile),
    or empty where the kernel did not build here. Returns the cache and what the run printed and logged."""
    cache = tmp_path_factory.mktemp("cache")
    built_here = lowbit_kernel.build_dir()  # the session's (conftest.py: linked to the set-up's), built by `built`
    folder = cache / "kernels" / built_here.name
    if any(built_here.glob("*.so")):  # copytree keeps the times, and torch rewrites build.ninja unchanged
        with FileLock(built_here.parent / "build.lock"):  # not while a build writes it
            shutil.copytree(built_here, folder, ignore=shutil.ignore_patterns("lock"))
    else:  # nothing built here: the run builds from nothing, or fails to
        folder.mkdir(parents=True)
    (folder / "lock").touch()  # torch's cpp_extension waits while this file exists
    (cache / "kernels" / "0123456789ab").mkdir()
    (cache / "kernels" / "0123456789ab" / "via_sd_lowbit_0123456789ab.so").touch()
    done = python("""
import sys
sys.modules["fcntl"] = None  # `import fcntl` raises ImportError
import logging
logging.basicConfig(level=logging.INFO)
from via_sd import DecodeConfig, generate, load_pair
from via_sd.weights import lowbit_kernel
print("kernel:", lowbit_kernel.available(), lowbit_kernel.why_not())
pair = load_pair("random")
print("tokens:", len(generate(pair, "abc", "sd", DecodeConfig(gamma=3, max_new_tokens=8)).tokens))
""", timeout=600, VIA_SD_CACHE=str(cache), OMP_NUM_THREADS="1")  # a tiny model: 2 threads spin on a busy machine
    return cache, done.stdout + done.stderr


def test_via_sd_imports_and_runs_the_random_pair_without_fcntl(fresh_build):
    _, out = fresh_build
    assert "tokens: 8" in out


@x86
@built
def test_a_build_killed_midway_does_not_block_the_next_one(fresh_build):
    cache, log = fresh_build
    assert "kernel: True None" in log
    folder = cache / "kernels" / lowbit_kernel.build_dir().name
    assert "removed a stale build lock" in log and str(folder / "lock") in log
    assert not (folder / "lock").exists() and any(folder.glob("*.so"))


@x86
@built
def test_the_cache_keeps_one_kernel_build(fresh_build):
    cache, log = fresh_build
    assert sorted(p.name for p in (cache / "kernels").iterdir() if p.is_dir()) == [lowbit_kernel.build_dir().name]
    assert "removed the old kernel build" in log


@x86
def test_a_failed_build_names_the_compilers_first_error(tmp_path):
    """The set-up's line and the app's status line name the first error (not ninja's last words), say that tokens
    differ from the kernel's, and the log holds the compiler's whole output."""
    broken = tmp_path / "broken.cpp"
    broken.write_text("#error the source is broken\n"  # line 1: an error
                      '#include "no_such_header.h"\n'  # line 2: a fatal one: the compiler stops, before the headers
                      + lowbit_kernel.SOURCE.read_text())
    # ninja finishes the compiles it started before it stops: the real attention.cpp, bandwidth.cpp and head_rows.cpp
    # would take most of a minute
    empty = tmp_path / "attention.cpp"
    empty.write_text("// not this test's subject\n")
    probe = tmp_path / "bandwidth.cpp"  # nor is the bandwidth probe
    probe.write_text("// not this test's subject\n")
    rows = tmp_path / "head_rows.cpp"  # nor the head's rows
    rows.write_text("// not this test's subject\n")
    done = python(f"""
from pathlib import Path
from via_sd.weights import lowbit_kernel
lowbit_kernel.SOURCE = Path({str(broken)!r})  # the seam: the sources the build compiles
lowbit_kernel.ATTENTION = Path({str(empty)!r})
lowbit_kernel.BANDWIDTH = Path({str(probe)!r})
lowbit_kernel.HEAD_ROWS = Path({str(rows)!r})

from via_sd.cli.setup import report_kernel
report_kernel()

import functools
import studio.models
studio.models.load_pair = functools.partial(studio.models.load_pair, weights="int4")  # random: fp32 unless asked
models = studio.models.Models("random")
models.pair("random", warm=False)
print("status:", models.status("random"))
""", timeout=300, VIA_SD_CACHE=str(tmp_path / "cache"))
    first = f"{broken}:1:2: error: #error the source is broken"
    setup, status = done.stdout.split("status:")
    status = html.unescape(status)
    assert first in setup and "tokens differ from the kernel's" in setup
    assert "full output is logged above" in setup
    assert first in status and "tokens differ from the kernel's" in status
    assert "no_such_header.h" in done.stderr and "ninja: build stopped" in done.stderr  # the log: all of it


@x86
@built
def test_a_pinned_aten_code_path_keeps_the_kernel_and_its_bits(tmp_path):
    """ATEN_CPU_CAPABILITY=default pins torch's own kernels for reproducibility; the project's kernel decides from
    the CPU itself, and its bits do not depend on ATen's code path."""
    g = torch.Generator().manual_seed(0)  # made here: randn's own bits follow ATen's code path
    torch.save([torch.randn(64, 128, generator=g), torch.randn(5, 128, generator=g)], tmp_path / "in.pt")
    code = """
import torch
from via_sd.weights import lowbit_kernel
from via_sd.weights.linears import Int4Linear, Int8Linear
w, x = torch.load("in.pt")
assert lowbit_kernel.available(), lowbit_kernel.why_not()
print(torch.backends.cpu.get_cpu_capability())
torch.save([Int4Linear.from_float(w, tiles=True)(x), Int8Linear.from_float([w], tiles=True)(x)], "OUT")
""".replace("in.pt", str(tmp_path / "in.pt"))
    done = python(code.replace("OUT", str(tmp_path / "pinned.pt")), ATEN_CPU_CAPABILITY="default",
                  VIA_SD_ATEN="native")  # native: via_sd keeps this pin (numerics.py)
    assert done.stdout.strip() == "DEFAULT"
    python(code.replace("OUT", str(tmp_path / "free.pt")))
    pinned, free = torch.load(tmp_path / "pinned.pt"), torch.load(tmp_path / "free.pt")
    assert all(torch.equal(a, b) for a, b in zip(pinned, free))
