"""Low-bit weights on CPU: int4 group-wise linears, low-bit embeddings, and the `weights=` settings.

    fp32      float32 everywhere (the reference)
    bf16      bfloat16 everywhere
    int4      every linear as 4-bit codes, groups of 32 along the input dimension,
              w = q * scale + offset on Q4_K's grid, run by the project's kernel (lowbit_kernel.cpp: activations
              as int8 per group of 32) or, where it cannot build, torch's `_weight_int4pack_mm_for_cpu` (bf16
              activations); everything else (norms, attention, residual) stays fp32. From a GGUF: its Q4_K tensors
              keep their own codes and scales exactly; in a verifier its Q6_K tensors too (Int6Linear, the
              project's kernel) and tensors it stores otherwise at 5-8 bits become per-channel int8 (Int8Linear)
              rather than lose bits; the output head's best 16 logits are re-scored exactly (RescoredHead)
    auto      CPU: int4 (the fastest setting whose teacher-forced top-1 agreement with fp32 is at
              least 0.99 on the bench prompts: BENCHMARKS.md); CUDA: bf16

The pieces live beside this module: linears.py (the int4 / int6 / int8 linears), tiles.py (the kernel's layouts),
lowbit_kernel.py (the kernel), heads.py (the
embedding and output heads), fused.py (q/k/v and gate/up as one int4 matmul each); their public names are re-exported here.
"""

from __future__ import annotations

import torch
from torch import nn

from .fused import fuse_linears
from .heads import FrequentHead, LowbitEmbedding, RescoredHead
from .linears import (BLOCK_N, GROUP, KERNEL_RULE, Int4Linear, Int6Linear, Int8Linear, int4_available, int4_shape_ok, int8_shape_ok,
                   kernel_rule, pack_nibbles, quantize_int4, unpack_nibbles)

__all__ = ["WEIGHTS", "GROUP", "BLOCK_N", "KERNEL_RULE", "Int4Linear", "Int6Linear", "Int8Linear", "RescoredHead",
           "FrequentHead", "LowbitEmbedding", "apply_weights", "fuse_linears", "int4_available",
           "int4_shape_ok", "int8_shape_ok", "kernel_rule", "pack_nibbles", "quantize_int4",
           "resolve_weights", "to_int4", "unpack_nibbles"]

# torch's dynamic int8 (`int8-dyn`, torch.ao.quantization) was dropped: torch deprecates that API, and its top-1
# agreement with fp32 was below the 0.99 that `auto` asks of a setting (BENCHMARKS.md).
WEIGHTS = ("auto", "fp32", "bf16", "int4")


def resolve_weights(weights: str | None, device) -> str:
    """'auto' -> the concrete setting for this device; checks the name."""
    weights = weights or "auto"
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights setting {weights!r}: choose one of {', '.join(WEIGHTS)}")
    cuda = torch.device(device).type == "cuda"
    if weights == "auto":
        return "bf16" if cuda else ("int4" if int4_available() else "fp32")
    if cuda and weights == "int4":
        raise ValueError(f"weights={weights!r} uses torch's CPU kernels; on CUDA use 'bf16' or 'fp32'")
    return weights


def _replace(model: nn.Module, make) -> int:
    """Replaces every module `make(name, module)` returns something for; returns how many."""
    count = 0
    for name, module in list(model.named_modules()):
        new = make(name, module)
        if new is not None:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
            count += 1
    return count


def to_int4(model: nn.Module) -> nn.Module:
    """Every nn.Linear the kernel can take -> Int4Linear (quantized group-wise from its float weight)."""
    def make(name, module):
        if type(module) is nn.Linear and int4_shape_ok(module.out_features, module.in_features):
            return Int4Linear.from_float(module.weight, module.bias)
        return None

    hooks = _keep_hooks(model)
    _replace(model, make)
    _restore_hooks(model, hooks)
    return model


def _keep_hooks(model):
    """Forward hooks and buffers of the output head (tiny test models suppress a token with one)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return None
    return dict(head._forward_hooks), {k: v for k, v in head._buffers.items() if k != "packed"}


def _restore_hooks(model, kept) -> None:
    if not kept:
        return
    hooks, buffers = kept
    head = model.get_output_embeddings()
    for key, hook in hooks.items():
        head._forward_hooks.setdefault(key, hook)
    for key, value in buffers.items():
        if key not in head._buffers:
            head.register_buffer(key, value, persistent=False)


def apply_weights(model: nn.Module, weights: str) -> nn.Module:
    """A float model loaded the usual way -> the requested setting (in place)."""
    if weights == "bf16":
        return model.to(torch.bfloat16)
    if weights == "int4":
        return to_int4(model.float())
    return model.float() if weights == "fp32" else model
