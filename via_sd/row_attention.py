"""Batch-invariant attention for verification passes: each new token attends exactly as a one-token step.

Greedy SD equals greedy AR only if a pass over k new tokens gives, for every one of them, the very
logits k one-token steps give. With fp32 weights the differences a batch makes are ~1e-7 and never
moved an argmax in our runs; with low-bit weights the activations are rounded to bf16 on the way into
every linear, which can turn such a difference into a different rounding and, at a near-tie, a
different token (it did on one of five held-out prompts). The int4 and int8 kernels compute every
row on its own, so attention is the one place where the batch matters: this module runs a pass that
extends a KV cache one query row at a time, each through the same SDPA call, on the same keys and
values, that a one-token step makes. Prompt prefill (nothing cached yet) and passes over more than
`MAX_ROWS` tokens take the usual batched call.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "via_sd_rows"
MAX_ROWS = 64


def _trivial(mask: torch.Tensor) -> bool:
    """A mask that lets every key through (a one-token step passes None instead)."""
    return bool(mask.all()) if mask.dtype == torch.bool else bool((mask == 0).all())


def row_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA, one query row at a time when the pass extends a cache (see the module docstring)."""
    rows, keys = query.shape[2], key.shape[2]
    past = keys - rows
    if rows == 1 or past == 0 or rows > MAX_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for i in range(rows):
        seen = past + i + 1  # the keys a one-token step at this position would hold
        mask = None if attention_mask is None else attention_mask[:, :, i:i + 1, :seen]
        if mask is not None and _trivial(mask):
            mask = None
        out, _ = sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :seen], value[:, :, :seen], mask,
                                        **kwargs)
        outputs.append(out)
    return torch.cat(outputs, 1), None  # [batch, rows, heads, head_dim], as sdpa_attention_forward returns


AttentionInterface.register(NAME, row_attention)


def use_row_attention(model) -> bool:
    """Switches a model that uses SDPA to row attention; returns whether it did (eager / flash models
    keep theirs, and with them no guarantee that a batch equals its one-token steps)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return True
