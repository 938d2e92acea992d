"""The drafter's forward without transformers' per-layer machinery: a Llama / Qwen2 decoder as a short loop
over the model's own modules, and a KV cache of preallocated buffers.

Why: a drafter step is ~100 small int4 matmuls and, around them, per layer, what a general forward does
for every model (a cache object that concatenates on every update, mask building, attention dispatch,
dtype round trips, hooks). On the embedded 0.5B drafter that machinery was about a third of a step
(`benchmarks/weights_passes.py --drafter`, torch.profiler: 970 int4 calls were 67% of the CPU time of ten
steps). Here a layer is ~25 tensor operations: RMSNorm (torch.rms_norm), the fused q/k/v matmul, rotary
embedding, a write into the cache buffers, one fixed-order attention call (row_attention.py), o_proj, RMSNorm, the
fused gate/up matmul, SiLU-gate, down_proj.

Only the drafter runs here. The drafter proposes and the verifier decides every token, so how the
drafter computes can change acceptance at most, never what SD outputs; its logits match transformers'
forward to float rounding (tests/test_lean.py). The verifier keeps transformers' forward and row
attention, bit for bit what one-token steps compute.

`LeanDecoder` has core.cached.CachedModel's interface (logits / rollback / seen); `drafter_cache` picks it
for a model it `supports` (a Llama-style decoder: full attention on every layer, a gated MLP, nothing
dispatched by accelerate hooks) and CachedModel for anything else.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn.functional as F

from .fused import FusedPart
from .heads import HeadContext, using_context
from .row_attention import extending, fixed_order_attention

ARCHITECTURES = ("llama", "qwen2")
FIRST_CAPACITY = 256  # cache rows allocated at first; doubled whenever a pass needs more


def supports(model) -> bool:
    """Can LeanDecoder run `model` exactly as its own forward does (up to float rounding)?"""
    config, inner = getattr(model, "config", None), getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in ARCHITECTURES:
        return False
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])) \
            or getattr(config, "use_sliding_window", False) or getattr(config, "pretraining_tp", 1) != 1:
        return False
    parts = ("embed_tokens", "norm", "rotary_emb", "layers")
    if not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
        return False
    return not any(hasattr(m, "_hf_hook") for m in model.modules())  # accelerate places those itself


class _Layer:
    """One decoder layer's modules, read once."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv = _joint(attn.q_proj, attn.k_proj, attn.v_proj)
        self.gate_up = _joint(mlp.gate_proj, mlp.up_proj)
        self.o, self.down, self.act = attn.o_proj, mlp.down_proj, mlp.act_fn
        self.scaling = attn.scaling


def _joint(*linears):
    """x -> the linears' outputs: one matmul when they are the parts of one fused layer (fused.py)."""
    fused = getattr(linears[0], "fused", None)
    if all(isinstance(m, FusedPart) and m.fused is fused for m in linears) \
            and [m.index for m in linears] == list(range(len(fused.bounds))):  # every part, in order
        layer, sizes = fused.layer, [m.out_features for m in linears]
        return lambda x: layer(x).split(sizes, -1)
    return lambda x: [m(x) for m in linears]


def _rms(norm, x: torch.Tensor) -> torch.Tensor:
    return torch.rms_norm(x, norm.weight.shape, norm.weight.to(x.dtype), norm.variance_epsilon)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding as transformers applies it (rotate_half over the two halves)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class LeanDecoder:
    """A decoder-only model with a KV cache of its own, run layer by layer (see the module docstring)."""

    def __init__(self, model, vocab_size: int, input_device, output_device):
        config, inner = model.config, model.model
        self.model, self.vocab_size = model, vocab_size
        self.input_device, self.output_device = input_device, output_device
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.embed, self.norm, self.rotary, self.head = inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head
        self.keys: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.seen = 0
        self.head_context = HeadContext()  # this run's context tokens for a frequency-ranked head

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
        self.rollback(upto - keep)  # a position asked for again is fed again
        start = self.seen
        ids = torch.tensor([seq[start:upto]], device=self.input_device)
        with using_context(self.head_context), extending(start > 0):
            if hasattr(self.head, "see"):  # a frequency-ranked head learns the context's tokens (heads.FrequentHead)
                self.head.see(ids, start == 0)
            hidden = self._forward(ids, start)
            logits = self.head(_rms(self.norm, hidden[:, -keep:]))
        self.seen = upto
        return logits[0, :, : self.vocab_size].to(self.output_device)

    def rollback(self, length: int) -> None:
        """Forgets every cached token past `length` (the buffers' rows past it are written over later)."""
        self.seen = min(self.seen, length)

    @torch.inference_mode()
    def fork(self) -> "LeanDecoder":
        """A copy with cache buffers of its own (the same model): a run starts from a cached opening (opening.py)."""
        twin = copy.copy(self)
        twin.keys, twin.values = [t.clone() for t in self.keys], [t.clone() for t in self.values]
        twin.head_context = replace(self.head_context)
        return twin

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n = ids.shape[1]
        end = start + n
        x = self.embed(ids)
        self._reserve(end, x)
        cos, sin = self.rotary(x, torch.arange(start, end, device=x.device)[None])
        cos, sin = cos[:, None], sin[:, None]  # [1, 1, n, head_dim]: the same for every head
        if n == 1:
            mask, causal = None, False
        elif start == 0:
            mask, causal = None, True
        else:  # rows after a cache: row i sees the cache and new rows 0..i
            mask, causal = torch.ones(n, end, dtype=torch.bool, device=x.device).tril(start), False
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            h = _rms(layer.norm1, x)
            q, k, v = layer.qkv(h)
            q = _rotate(q.view(1, n, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            keys[:, :, start:end] = _rotate(k.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            values[:, :, start:end] = v.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            a = fixed_order_attention(q, keys[:, :, :end], values[:, :, :end], layer.scaling, layer.o)
            if a is None:  # weights not on the project's kernel: torch's SDPA
                a = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                                   is_causal=causal, scale=layer.scaling,
                                                   enable_gqa=self.kv_heads != self.heads).transpose(1, 2)
            x = x + layer.o(a.reshape(1, n, self.heads * self.head_dim))
            gate, up = layer.gate_up(_rms(layer.norm2, x))
            x = x + layer.down(layer.act(gate) * up)
        return x

    def _reserve(self, rows: int, like: torch.Tensor) -> None:
        """Cache buffers of at least `rows` rows (grown by doubling, what is cached kept)."""
        capacity = self.keys[0].shape[2] if self.keys else 0
        if rows <= capacity:
            return
        size = max(FIRST_CAPACITY, 2 * capacity, rows)
        shape = (1, self.kv_heads, size, self.head_dim)

        def grown(old):
            new = torch.empty(shape, dtype=like.dtype, device=like.device)
            if old is not None:
                new[:, :, :capacity] = old
            return new

        old_k, old_v = self.keys or [None] * len(self.layers), self.values or [None] * len(self.layers)
        self.keys, self.values = [grown(t) for t in old_k], [grown(t) for t in old_v]
