"""What CPU this is, in words a report and a cache key can tell machines apart by.

The model name alone does not: a cloud VM on AMD reports "AMD EPYC" for Zen 3, Zen 4 and Zen 5 alike, and Zen 4
runs a 512-bit instruction in two halves where Zen 5 runs it whole, so a verification pass's arithmetic costs about
twice as long on one as on the other (BENCHMARKS.md, 2026-12-05 (night)). So the name carries the CPU's family and
model too, and for AMD the core generation they stand for.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

# AMD's x86 families by core generation; family 25 holds Zen 3 and Zen 4, told apart by model
# (AMD's "Processor Programming Reference" of each family lists its models).
ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


def amd_core(family: int, model: int) -> str | None:
    """The Zen generation of an AMD family and model, None for one this table does not know."""
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen"
    if family == 0x19:
        return "Zen 4" if any(model in models for models in ZEN4_MODELS) else "Zen 3"
    if family == 0x1A:
        return "Zen 5"
    return None


def describe_cpu(cpuinfo: str) -> str | None:
    """The first processor of a /proc/cpuinfo text in words: "AMD EPYC (Zen 4; family 25, model 17)",
    "Intel(R) Xeon(R) Platinum 8488C (family 6, model 143)"; None where it names no model."""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block ends
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return None
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return name
    core = amd_core(family, model) if fields.get("vendor_id") == "AuthenticAMD" else None
    return f"{name} ({core + '; ' if core else ''}family {family}, model {model})"


@cache
def cpu_name() -> str:
    """This machine's CPU (describe_cpu), or what the platform module knows where there is no /proc/cpuinfo. Read
    once a process: the profile's key asks for it at every run, and /proc/cpuinfo is made anew for every core."""
    try:
        described = describe_cpu(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        described = None
    return described or platform.processor() or platform.machine() or "unknown CPU"
