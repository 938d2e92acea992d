"""The GPU window on a ZeroGPU Space: every call that runs a model goes through `gpu(...)`.

On ZeroGPU (`spaces` installed, SPACES_ZERO_GPU set) a process holds a GPU only inside a function
wrapped by `spaces.GPU`; CUDA work outside one (e.g. a warm-up in a background thread) fails or runs
on no GPU. Elsewhere `gpu` returns the function unchanged.
"""

from __future__ import annotations

import os

try:  # `spaces` must be imported before torch touches CUDA
    import spaces
except ImportError:
    spaces = None

ON_ZERO_GPU = spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")

# How long one Run may hold the GPU, for the longest run the page allows: max new tokens 512 (the
# slider's maximum) for each of AR, SD and VIA-SD on the `gpu` preset (Qwen2.5 0.5B -> 7B, bf16, eager).
# A 7B one-token pass is memory-bound (~15 GB of weights) plus ~28 layers of Python launch overhead:
# about 30 ms on a ZeroGPU slice; a 0.5B drafter step about 15 ms (launch-bound, 24 layers).
#   AR:            512 tokens x 30 ms                                    ~ 15 s
#   SD / VIA-SD:   worst case one token per round (every draft rejected): 512 rounds x
#                  (5 drafts x 15 ms + one 6-row verification ~35 ms + slim ~30 ms) ~ 512 x 0.14 s ~ 72 s each
#   fidelity, prompt reads, the first call's warm-up (kernels, allocator):  ~ 15 s
# 15 + 2 x 72 + 15 ~ 175 s; with a 1.3x margin for a busy slice: 230 s. A shorter run asks for less
# (`run_seconds`): ZeroGPU schedules short requests first and checks a visitor's quota against it.
PER_TOKEN_S = {"ar": 0.03, "sd": 0.14, "via": 0.14}
FIXED_S = 15
MARGIN = 1.3
MAX_RUN_S = int(MARGIN * (FIXED_S + 512 * sum(PER_TOKEN_S.values())))  # 230 s at 512 tokens x 3 methods
WARM_UP_S = 60


def run_seconds(max_new_tokens=512, methods=("ar", "sd", "via")) -> int:
    """Seconds to ask for a run of `max_new_tokens` per method (at most MAX_RUN_S)."""
    try:
        n = min(max(int(max_new_tokens), 1), 512)
    except (TypeError, ValueError):
        n = 512
    return min(MAX_RUN_S, int(MARGIN * (FIXED_S + n * sum(PER_TOKEN_S[m] for m in methods))) + 1)


def gpu(duration=60):
    """`spaces.GPU(duration=...)` on ZeroGPU (a number of seconds, or a function of the call's arguments
    that returns one); elsewhere a decorator that changes nothing."""
    if spaces is None:
        return lambda fn: fn
    return spaces.GPU(duration=duration)
