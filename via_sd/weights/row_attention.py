"""Attention for every pass of the verifier: each new token attends exactly as a one-token step, in the same bits on
every x86 machine.

With low-bit weights on the project's kernel every pass runs its fixed-order causal attention (attention.cpp,
through lowbit_kernel): each row computes alone, in one order of arithmetic, without MKL (whose sgemm, under
torch's SDPA, picked other code on AMD than on Intel). Elsewhere (CUDA, fp32 or bf16 weights, a mask that is not
plainly causal, a soft cap, no kernel) the SDPA path below keeps the batch invariance:

Greedy SD equals greedy AR only if a pass over k new tokens gives, for every one of them, the very
logits k one-token steps give. With fp32 weights the differences a batch makes are ~1e-7 and never
moved an argmax in our runs; with low-bit weights the activations are rounded to bf16 on the way into
every linear, which can turn such a difference into a different rounding and, at a near-tie, a
different token (it did on one of five held-out prompts). The int4 and int8 kernels compute every
row on its own, so attention is the one place where the batch matters: this module runs every pass
that extends a KV cache, of any length, one query row at a time, each through the same SDPA call, on
the same keys, values and mask, that a one-token step at that position makes. Only the prompt read
(nothing cached yet, or only the chat template's opening that every method starts from: nothing to
match) takes the usual batched call.

The mask comes from transformers' SDPA mask builder, registered under the same name (a name without
a mask function gets no mask at all, which drops sliding windows and, for a batched call over a
cache, crops the keys). A row's mask is the step's mask: the same mask function at the same query
position over the same keys; a mask that lets every key through is passed as None on both paths.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import lowbit_kernel

NAME = "via_sd_rows"
# True while a forward extends a KV cache (a verification pass or a catch-up; not the prompt read): such a pass
# attends one query row at a time, as its one-token steps do.
EXTENDING: ContextVar[bool] = ContextVar("via_sd_extending", default=False)
# True while a prompt is read after a cached opening (opening.py): that pass extends a cache but matches no steps
# (every method reads the same rest of the same prompt in a call of its own), so it reads as a prompt read does.
READING_PROMPT: ContextVar[bool] = ContextVar("via_sd_reading_prompt", default=False)


@contextmanager
def extending(flag: bool = True):
    """Marks the forward run inside as one that extends a cache (or not; never while reading a prompt)."""
    token = EXTENDING.set(flag and not READING_PROMPT.get())
    try:
        yield
    finally:
        EXTENDING.reset(token)


@contextmanager
def reading_prompt():
    """Marks the forwards run inside as reading a prompt: batched attention, the many-row kernel allowed."""
    token = READING_PROMPT.set(True)
    try:
        yield
    finally:
        READING_PROMPT.reset(token)


def _trivial(mask: torch.Tensor) -> bool:
    """A mask that lets every key through."""
    return bool(mask.all()) if mask.dtype == torch.bool else bool((mask == 0).all())


def _row_mask(mask: torch.Tensor | None, row: int, seen: int) -> torch.Tensor | None:
    """Query row `row`'s mask over the first `seen` keys, in one form for a pass and a step alike."""
    if mask is None:
        return None
    mask = mask[:, :, row:row + 1, :seen]
    return None if _trivial(mask) else mask.contiguous()


def _causal(mask: torch.Tensor | None, rows: int, keys: int) -> bool:
    """Does `mask` let row i see exactly keys 0 .. keys - rows + i (None: SDPA's own causal or full rule)?"""
    if mask is None:
        return True
    seen = torch.arange(keys, device=mask.device) <= torch.arange(keys - rows, keys, device=mask.device)[:, None]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.shape[-2:] == seen.shape and bool((allowed == seen).all())


def fixed_order_attention(query, key, value, scale: float, linear, mask=None, **extra) -> torch.Tensor | None:
    """[batch, rows, heads, head_dim] from the fixed-order kernel, or None where it does not apply (then SDPA).
    It serves layers whose linears run the project's kernel (`linear`: one of them): the rest of such a forward
    is machine-independent too (fp32 and bf16 weights take torch's matmuls, MKL's on CPU)."""
    if getattr(linear, "layout", None) != "tiles" or query.dtype != torch.float32 or not lowbit_kernel.has_attention() \
            or any(extra.get(k) for k in ("dropout", "softcap", "s_aux")) \
            or not _causal(mask, query.shape[2], key.shape[2]):
        return None
    return lowbit_kernel.causal_attention(query, key, value, scale)


def row_attention(module, query, key, value, attention_mask, **kwargs):
    """Fixed-order attention on CPU; else SDPA, one query row at a time when the pass extends a cache (see the
    module docstring)."""
    fixed = fixed_order_attention(query, key, value, kwargs.get("scaling") or module.scaling,
                                  getattr(module, "o_proj", None), attention_mask, **kwargs)
    if fixed is not None:
        return fixed, None
    rows, keys = query.shape[2], key.shape[2]
    past = keys - rows
    if past == 0 or not EXTENDING.get():  # the prompt read (from an empty cache, or after a cached opening)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for i in range(rows):
        seen = past + i + 1  # the keys a one-token step at this position holds
        out, _ = sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :seen], value[:, :, :seen],
                                        _row_mask(attention_mask, i, seen), **kwargs)
        outputs.append(out)
    return (outputs[0] if rows == 1 else torch.cat(outputs, 1)), None  # [batch, rows, heads, head_dim]


AttentionInterface.register(NAME, row_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # causal and sliding-window masks as SDPA gets them


def use_row_attention(model) -> bool:
    """Switches a model that uses SDPA to row attention; returns whether it did (eager / flash models
    keep theirs, and with them no guarantee that a batch equals its one-token steps)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    _mark_extending_passes(model)
    return True


_MARKS = threading.local()  # per thread: the EXTENDING tokens to reset, innermost last (a run's, not the model's)


def _marks() -> list:
    if not hasattr(_MARKS, "tokens"):
        _MARKS.tokens = []
    return _MARKS.tokens


def _mark_extending_passes(model) -> None:
    """Sets EXTENDING around every forward of `model` that is given a non-empty cache (hooks added once). A forward
    runs in one thread from start to end, so each thread keeps its own stack: runs in several threads on one model
    never reset each other's marks."""
    if getattr(model, "_via_sd_marks_extending", False):
        return
    model._via_sd_marks_extending = True

    def before(_module, _args, kwargs):
        cache = kwargs.get("past_key_values")
        extends = cache is not None and cache.get_seq_length() > 0 and not READING_PROMPT.get()
        _marks().append(EXTENDING.set(extends))

    def after(_module, _args, _kwargs, _output):
        EXTENDING.reset(_marks().pop())

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True, always_call=True)
