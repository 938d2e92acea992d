"""A transformers model built from a GGUF's tensors (gguf_pack.Entries) in a `weights=` setting, one tensor at a time.

For int4: Q4_K tensors keep their codes, scales and offsets exactly in the kernel's layout (their blocks' bytes
rearranged: tiles.q4k_tiles), Q6_K ones too in a verifier (tiles.q6k_tiles), others become int8 or re-quantized int4, the verifier's head re-scores its best logits (heads.RescoredHead), the drafter's
head scores only the most frequent tokens (heads.FrequentHead, from the shipped list in
assets/token_freq/), and q/k/v and gate/up run as one matmul each (fused.py).
"""

from __future__ import annotations

import ctypes
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .fused import fuse_linears
from .gguf_codes import decompose
from .heads import FrequentHead, LowbitEmbedding, RescoredHead
from .linears import (Int4Linear, Int6Linear, Int8Linear, int4_shape_ok, int8_shape_ok, pack_nibbles, quantize_int4,
                      use_tiles)
from .tiles import q4k_tiles, q6k_tiles

# the drafter head's tokens: c 0.373 (N 32768: 0.367, 65536: 0.41; whole head 0.439), 0.951 of the
# verifier's greedy tokens in it (32768: 0.909); benchmarks/weights_passes.py --drafter,
# scripts/build_token_freq.py --coverage
FREQUENT = 49152
TOKEN_FREQ = Path(__file__).resolve().parents[2] / "assets" / "token_freq" / "qwen2.json"


@lru_cache(maxsize=4)
def _token_freq(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def frequent_ids(config, n: int, path: Path = TOKEN_FREQ) -> torch.Tensor | None:
    """The `n` most frequent token ids (plus the list's special tokens, e.g. end of turn) for a model of
    this vocabulary, rounded up to a multiple of 16 by the next ranked ids; None when the list does not fit."""
    table = _token_freq(path)
    if not table or table.get("model_type") != config.model_type or table.get("vocab_size") != config.vocab_size:
        return None
    ranked = table["ids"]
    if n >= len(ranked) or n <= 0:
        return None
    ids = set(ranked[:n]) | set(table["special_ids"])
    extra = [i for i in ranked[n:] if i not in ids][: -len(ids) % 16]  # the kernel takes multiples of 16 rows
    return torch.tensor(sorted(ids.union(extra)))


def release_freed_memory() -> None:
    """Hands memory freed since the last call back to the system (glibc's malloc_trim; elsewhere a no-op).
    Building a model tensor by tensor frees each tensor's temporaries, but glibc keeps freed blocks for reuse,
    scattered between live ones: the embedded pair's build peaked 0.5-0.8 GB above what it finally held."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# weights converted between two trims: a trim walks the whole heap, so once per linear made the embedded pair's
# load ~2 s slower (9.5-10.4 s against 7.3-8.3 s); once per this many weights (a layer or two): +0.5-0.7 s, and
# the load's peak 2.51-2.63 GB (2.38-2.56 trimming every linear, 2.76-2.84 never)
TRIM_EVERY = 64 << 20


@lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


# Threads of a build. Its steps are short torch copies and numpy work (one thread whatever torch's count): on a quiet
# machine two threads built the embedded verifier in 9.6 s against 12.4 s on one; beside a busy second core (a
# first start's browser and server) 22-38 s against 13-15 s.
BUILD_THREADS = 1


def build_model(config, entries, weights: str, rows: int = 2048, exact_top1: bool = True, fuse: bool | None = None,
                frequent: int | None = FREQUENT):
    """A transformers causal LM from a GGUF's tensors (gguf_pack.Entries), in the requested weights setting, one
    tensor (and `rows` rows of it) at a time (the whole float model exists only for fp32 / bf16).

    int4: Q4_K tensors keep their codes, scales and offsets in the int4 kernel's layout (exactly); float tensors
    are quantized to int4. With `exact_top1` (a verifier: its top-1 is the output) Q6_K tensors keep theirs too
    (Int6Linear, with the project's kernel), tensors of other types become per-channel int8 (Int8Linear), and
    the output head re-scores its best logits exactly (RescoredHead); without (a drafter: it only proposes, and
    int8 made it 1.6x slower) they are re-quantized to int4 too.

    `fuse` (int4): q/k/v and gate/up as one int4 matmul each (fused.py; bit for bit the same outputs, and one
    quantization of the input serves every part); None: yes, verifier and drafter alike.
    `frequent` (int4, a drafter only, i.e. without `exact_top1`): its head scores only the `frequent`
    most frequent tokens of the shipped list (heads.FrequentHead), when the list fits the model's
    vocabulary; None keeps the whole head. What the model got is in `model.via_sd_weights`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build(config, entries, weights, rows, exact_top1, fuse, frequent)
    finally:
        torch.set_num_threads(threads)


def _build(config, entries, weights: str, rows: int, exact_top1: bool, fuse: bool | None, frequent: int | None):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    build = _Builder(entries, weights, rows, exact_top1, model.get_output_embeddings())
    since_trim = 0  # weights converted since freed memory was last handed back
    for name, module in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        if isinstance(module, torch.nn.Linear):
            since_trim += module.in_features * module.out_features
            if since_trim > TRIM_EVERY:  # the temporaries so far, before the next tensor's
                release_freed_memory()
                since_trim = 0
            build.linear(holder, child, name, module)
        elif isinstance(module, torch.nn.Embedding):
            build.embedding(holder, child, name, module)
    for name, param in list(model.named_parameters()):
        if param.is_meta:  # norms and anything else: plain float tensors
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, build.dense(name))
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"buffer {name} was not initialised")
    model.eval()
    if weights == "int4":
        _narrow_and_fuse(model, True if fuse is None else fuse, None if exact_top1 else frequent)
    release_freed_memory()
    return model


class _Builder:
    """Turns one stored tensor at a time into the module of a `weights` setting (build_model's steps)."""

    def __init__(self, entries, weights: str, rows: int, exact_top1: bool, head):
        self.entries, self.weights, self.rows, self.exact_top1, self.head = entries, weights, rows, exact_top1, head
        self.dtype = torch.bfloat16 if weights == "bf16" else torch.float32

    def source(self, name: str) -> str:
        have = self.entries.keys()
        if name in have:
            return name
        if name == "lm_head.weight" and "model.embed_tokens.weight" in have:  # a tied head
            return "model.embed_tokens.weight"
        raise KeyError(f"the weights have no {name}")

    def dense(self, name: str) -> torch.nn.Parameter:
        return torch.nn.Parameter(self.entries.float(self.source(name)).to(self.dtype), requires_grad=False)

    def linear(self, holder, child: str, name: str, module) -> None:
        """The linear `name` in this setting: a low-bit module, or its float weight (and bias) filled in."""
        w = self.source(f"{name}.weight")
        bias = self.entries.float(f"{name}.bias") if module.bias is not None else None
        new = self.low_bit(module, w, bias) if self.weights == "int4" else None
        if new is not None:
            setattr(holder, child, new)
            return
        module.weight = self.dense(w)
        if bias is not None:
            module.bias = torch.nn.Parameter(bias.to(self.dtype), requires_grad=False)

    def embedding(self, holder, child: str, name: str, module) -> None:
        """int4: the stored codes as they are (4-bit ones two to a byte), chunk by chunk; else the float weight."""
        w, entries = self.source(f"{name}.weight"), self.entries
        if self.weights != "int4" or not entries.is_codes(w):
            module.weight = self.dense(w)
            return
        parts = [entries.codes(w, rows) for rows in entries.chunks(w, self.rows)]
        first, nibbles = parts[0], parts[0].bits == 4
        codes = np.concatenate([pack_nibbles(p.codes) if nibbles else p.codes for p in parts])
        scale = np.concatenate([p.scale for p in parts])
        offset = None if first.offset is None else torch.from_numpy(np.concatenate([p.offset for p in parts]))
        setattr(holder, child, LowbitEmbedding(torch.from_numpy(codes), torch.from_numpy(scale), offset, first.zero,
                                               first.group, module.padding_idx, packed=nibbles))

    def low_bit(self, module, w: str, bias):
        """The int4-setting module for linear `module` with weight tensor `w`, or None (stays float)."""
        n, k, entries = module.out_features, module.in_features, self.entries
        chunks = entries.chunks(w, self.rows)
        if not entries.is_codes(w):
            if not int4_shape_ok(n, k):
                return None
            return Int4Linear.from_codes((quantize_int4(entries.float(w, rows)) for rows in chunks), bias)
        kind = entries.type(w)
        if module is self.head and self.exact_top1 and int4_shape_ok(n, k):
            return RescoredHead(self.int4(w, bias), entries.exact_rows(w))
        if (kind == "Q4_K" or not self.exact_top1) and int4_shape_ok(n, k):
            return self.int4(w, bias)
        if kind == "Q6_K" and use_tiles() and Int6Linear.shape_ok(n, k):
            return Int6Linear.from_tiles((self.q6k(w, rows) for rows in chunks), bias)
        if int8_shape_ok(n, k):
            return Int8Linear.from_float((entries.dequantize(w, rows) for rows in chunks), bias)
        return None

    def int4(self, name: str, bias) -> Int4Linear:
        """In the int4 kernel's numbers: Q4_K blocks as they are (in the project's layout, their bytes rearranged),
        anything else (Q4_0, Q4_1, 5-, 6-, 8-bit, group 16) re-quantized to Q4_K's grid from the exact values."""
        entries, chunks = self.entries, self.entries.chunks(name, self.rows)
        if entries.type(name) != "Q4_K":
            return Int4Linear.from_codes((quantize_int4(entries.dequantize(name, rows)) for rows in chunks), bias)
        if use_tiles():
            return Int4Linear.from_tiles((q4k_tiles(torch.from_numpy(entries.raw(name, rows))) for rows in chunks),
                                         bias)
        codes = (entries.codes(name, rows) for rows in chunks)
        return Int4Linear.from_codes(((torch.from_numpy(c.codes), torch.from_numpy(c.scale),
                                       torch.from_numpy(c.offset)) for c in codes), bias)

    def q6k(self, name: str, rows: slice):
        raw = self.entries.raw(name, rows)
        codes = decompose(raw, "Q6_K", (raw.shape[0], self.entries.shape(name)[1])).codes
        return q6k_tiles(torch.from_numpy(raw), torch.from_numpy(codes))


def _narrow_and_fuse(model, fuse: bool, frequent: int | None) -> None:
    """The int4 drafter's cheaper head and the fused matmuls, recorded in `model.via_sd_weights`."""
    notes = ["int4"]
    if isinstance(model.get_output_embeddings(), RescoredHead):
        notes.append("head's best 16 re-scored exactly")
    head, ids = model.get_output_embeddings(), frequent_ids(model.config, frequent) if frequent else None
    if ids is not None and type(head) is Int4Linear:
        narrow = FrequentHead(head, ids)
        model.set_output_embeddings(narrow)
        narrow.watch(model)
        notes.append(f"head over the {len(ids)} most frequent of {head.out_features} tokens and the context's")
    if fuse and fuse_linears(model):
        notes.append("q/k/v and gate/up fused")
    model.via_sd_weights = ", ".join(notes)
