"""Bench methods per drafter (issue 27): our SD and VIA-SD with each drafter, and transformers' own drafters that
need no second model, as peers.

    sd-lookup, sd-hybrid, sd-exit      plain SD with prompt lookup, the hybrid, the verifier's early exit
    via-lookup, via-hybrid, via-exit   VIA-SD with them (the paper's slim signal: lookup has no p(x))
    hf-lookup                          transformers' prompt lookup (`prompt_lookup_num_tokens`)
    hf-exit                            transformers' early exit (`assistant_early_exit`)

`ar`, `sd` and `via` keep the config's drafter (the model drafter unless --drafter says otherwise). Every greedy run
is checked against AR of the same prompt and repeat (`identical_to_ar`).
"""

from __future__ import annotations

from dataclasses import replace

from ..core.decoding import Clock, DecodeConfig, generate
from .calls import trace_record
from .hf import generate_hf_self
from .methods import DRAFTER_METHODS, HF_SELF, KINDS  # noqa: F401 (re-exported)


def run_drafter_method(pair, prompt: str, method: str, config: DecodeConfig) -> tuple[dict, object]:
    """One timed run of a drafter method: (record, trace or None for transformers' peers)."""
    clock = Clock(pair.slim.device)
    start = clock.ms()
    if method in HF_SELF:
        token_ids, calls = generate_hf_self(pair, prompt, method, config)
        wall_ms = clock.ms() - start
        n = len(token_ids)
        return {"tokens_per_s": 1000.0 * n / wall_ms if wall_ms > 0 else 0.0, "wall_ms": wall_ms, "new_tokens": n,
                "prompt_tokens": len(pair.encode(prompt, chat=config.chat)), "token_ids": token_ids,
                "drafter_calls": calls["drafter"], "full_calls": calls["full"]}, None
    base, kind = method.split("-", 1)
    trace = generate(pair, prompt, base, replace(config, drafter=KINDS[kind]))
    return trace_record(trace, clock.ms() - start), trace

NAMES = {"sd-lookup": "SD + lookup", "sd-hybrid": "SD + hybrid", "sd-exit": "SD + early exit",
         "via-lookup": "VIA-SD + lookup", "via-hybrid": "VIA-SD + hybrid", "via-exit": "VIA-SD + early exit",
         "hf-lookup": "HF prompt lookup", "hf-exit": "HF early exit"}
