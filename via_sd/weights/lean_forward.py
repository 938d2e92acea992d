"""A Llama / Qwen2 decoder run as a short loop over the model's own modules, with a KV cache of preallocated buffers:
the drafter's forward, and the verifier's (full and slim) wherever its attention is the kernel's fixed order.

Why: a decoding step is ~200 small low-bit matmuls and, around them, per layer, what a general forward does for
every model (a cache object that concatenates on every update, mask building, attention dispatch, dtype round
trips, hooks, a module call per norm). Here a sub-layer is a dozen tensor operations: RMSNorm (torch.rms_norm), the
fused q/k/v matmul, rotary embedding of q and k in one go, a write into the cache buffers, one fixed-order attention
call (attention.cpp), o_proj; RMSNorm, the fused gate/up matmul, SiLU-gate, down_proj.

`LeanNet.run` runs any range of sub-layers (k = 2 * layer: attention, 2 * layer + 1: MLP), skipping a set of them,
as routing.SlimVerifier.run does: the full verifier, the slim one (a route's sub-layers skipped) and progressive
verification's shared trunk are all this loop.

On the project's kernel (`exact(model)`) a sub-layer is one C++ call (lowbit_kernel.attention_sublayer /
mlp_sublayer) making these very operations in this order (its rms_norm leaves ATen's one sum to ATen), so the same
bits without the ~30 dispatches and the Python between a sub-layer's matmuls.

The verifier's bits: with its linears on the project's kernel (`exact(model)`), every operation here is the one
transformers' forward (and SlimVerifier) runs, on the same values: torch.rms_norm is ATen's composite of the very
pow / mean / rsqrt / mul that Qwen2RMSNorm calls; rotate_half(x) * sin is roll(x) * (sin with its first half
negated), the same products (a sign flip is exact); the residual adds, SiLU-gate and attention (fixed order, any
strides) are the same. So a step or a k-row pass gives bit for bit the logits of transformers' forward
(tests/test_lean_verifier.py). Elsewhere (fp32 weights, torch's kernels, a GPU) only the drafter runs here, with
torch's SDPA: its logits match transformers' to float rounding, and the drafter proposes, never decides.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
import torch.nn.functional as F

from . import lowbit_kernel
from .fused import FusedPart
from .heads import HeadContext, using_context
from .lean_cache import LeanCache, grown

ARCHITECTURES = ("llama", "qwen2")


def supports(model) -> bool:
    """Can LeanNet run `model` as its own forward does (up to float rounding)?"""
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


def exact(model) -> bool:
    """Does LeanNet give `model`'s own forward's bits (every attention the kernel's fixed order, float32)?"""
    if not supports(model) or model.model.norm.weight.dtype != torch.float32:
        return False
    tiles = all(getattr(layer.self_attn.o_proj, "layout", None) == "tiles" for layer in model.model.layers)
    return tiles and lowbit_kernel.module() is not None  # layers in tiles mean the kernel built here


def _fused_in_order(linears) -> bool:
    """Are `linears` every part, in order, of one fused layer (fused.py)?"""
    fused = getattr(linears[0], "fused", None)
    return all(isinstance(m, FusedPart) and m.fused is fused for m in linears) \
        and [m.index for m in linears] == list(range(len(fused.bounds)))


class _Layer:
    """One decoder layer's modules and constants, read once."""

    def __init__(self, layer, heads: int, kv_heads: int):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.shape1, self.w1, self.eps1 = self.norm1.weight.shape, self.norm1.weight, self.norm1.variance_epsilon
        self.shape2, self.w2, self.eps2 = self.norm2.weight.shape, self.norm2.weight, self.norm2.variance_epsilon
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        self.qkv = q.fused.layer if _fused_in_order([q, k, v]) else None  # q, k and v in one matmul
        self.qk = q.fused.layer if self.qkv is None and _fused_in_order([q, k]) else None  # q and k in one
        self.q, self.k, self.v = q, k, v
        self.o, self.down, self.scaling = attn.o_proj, mlp.down_proj, attn.scaling
        gate, up = mlp.gate_proj, mlp.up_proj
        self.gate_up = gate.fused.layer if _fused_in_order([gate, up]) else None
        self.gate, self.up, self.inner = gate, up, gate.out_features
        self.act = F.silu if isinstance(mlp.act_fn, torch.nn.SiLU) else mlp.act_fn
        self.heads, self.kv_heads = heads, kv_heads
        self.calls = self._kernel_calls()

    def _kernel_calls(self):
        """(q/k/v, o, gate/up, down) as the kernel's one-call descriptions (lowbit_kernel.parts), or None where a
        linear is not on the kernel in tiles."""
        qkv = [self.qkv] if self.qkv is not None else [self.qk, self.v] if self.qk is not None else [self.q, self.k, self.v]
        gate_up = [self.gate_up] if self.gate_up is not None else [self.gate, self.up]
        try:
            return tuple(lowbit_kernel.parts(group) for group in (qkv, [self.o], gate_up, [self.down]))
        except (ValueError, AttributeError):
            return None

    def project(self, x: torch.Tensor, n: int, head_dim: int):
        """(q and k side by side [1, n, heads + kv_heads, head_dim], v [1, n, kv_heads, head_dim]): views of one
        matmul's output where the layer is fused."""
        both = self.heads + self.kv_heads
        if self.qkv is not None:
            y = self.qkv(x).reshape(1, n, both + self.kv_heads, head_dim)
            return y[:, :, :both], y[:, :, both:]
        v = self.v(x).reshape(1, n, self.kv_heads, head_dim)
        qk = self.qk(x) if self.qk is not None else torch.cat([self.q(x), self.k(x)], -1)
        return qk.reshape(1, n, both, head_dim), v

    def gated(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            y = self.gate_up(x)
            return self.act(y[..., :self.inner]) * y[..., self.inner:]
        return self.act(self.gate(x)) * self.up(x)


class LeanNet:
    """A decoder-only model's modules, run sub-layer by sub-layer over a LeanCache (see the module docstring)."""

    def __init__(self, model):
        config, inner = model.config, model.model
        self.model, self.config = model, config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = [_Layer(layer, self.heads, self.kv_heads) for layer in inner.layers]
        self.embed, self.norm, self.rotary, self.lm_head = inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head
        self.exact = exact(model)
        self.kernel = self.exact and all(layer.calls is not None for layer in self.layers)  # a sub-layer a call
        half = self.head_dim // 2
        self.sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)])  # rotate_half's signs
        self.rope_fixed = getattr(self.rotary, "rope_type", None) == "default"  # not dynamic / long-rope
        self.rope_rows = None  # a fixed RoPE's (cos, sin) [positions, head_dim] (_rope)

    @property
    def sublayers(self) -> int:
        return 2 * len(self.layers)

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers))

    def run(self, h: torch.Tensor, start: int, cache: LeanCache, sublayers: range, skip=frozenset()) -> torch.Tensor:
        """Runs `sublayers` (but those in `skip`) on hidden states h [1, n, hidden] of positions start.."""
        ran = [k for k in sublayers if k not in skip]
        if not ran:
            return h
        n = h.shape[1]
        rope = None
        if self.kernel:
            return self._run_kernel(h.contiguous(), start, cache, ran)
        for k in ran:
            layer = self.layers[k >> 1]
            if k & 1:
                x = torch.rms_norm(h, layer.shape2, layer.w2, layer.eps2)
                h = h + layer.down(layer.gated(x))
                continue
            if rope is None:  # once per pass: [n, head_dim], the same for every head
                rope = self._rope(h, start, n)
            h = self._attend(k >> 1, layer, h, start, cache, rope)
        return h

    def _rope(self, h: torch.Tensor, start: int, n: int):
        """cos and sin (sin's first half negated: rotate_half's signs) of positions start.., [n, head_dim] each. A
        fixed RoPE's are rows of a table of positions 0.. made by the same elementwise call (each row the bits of a
        pass over its position alone), grown by doubling: a pass makes no ATen call here (~0.1 ms a drafter step)."""
        if not self.rope_fixed:
            return self._rope_of(h, start, n)
        rows, end = self.rope_rows, start + n  # one read, one assignment: a run in another thread sees either table
        if rows is None or rows[0].shape[0] < end or (rows[0].dtype, rows[0].device) != (h.dtype, h.device):
            rows = self.rope_rows = self._rope_of(h, 0, grown(len(rows[0]) if rows else 0, end))
        return rows[0][start:end], rows[1][start:end]

    def _rope_of(self, h: torch.Tensor, start: int, n: int):
        cos, sin = self.rotary(h, torch.arange(start, start + n, device=h.device)[None])
        return cos[0].contiguous(), (sin * self.sign.to(sin.device))[0].contiguous()

    def _run_kernel(self, h: torch.Tensor, start: int, cache: LeanCache, ran: list) -> torch.Tensor:
        """`run` on the kernel: a sub-layer a call (lowbit_kernel.attention_sublayer / mlp_sublayer), each the steps
        `_attend` and the MLP branch of `run` take, in C++, with their bits (tests/test_lean_verifier.py)."""
        n, rope = h.shape[1], None
        for k in ran:
            layer = self.layers[k >> 1]
            qkv, o, gate_up, down = layer.calls
            if k & 1:
                h = lowbit_kernel.mlp_sublayer(h, layer.w2, layer.eps2, gate_up, layer.inner, down)
                continue
            if rope is None:
                rope = self._rope(h, start, n)
            keys, values = cache.extend(k >> 1, start, start + n, h, self.kv_heads, self.head_dim)
            h = lowbit_kernel.attention_sublayer(h, layer.w1, layer.eps1, qkv, *rope, keys, values, start, self.heads,
                                                 layer.scaling, o)
        return h

    def _attend(self, i: int, layer: _Layer, h: torch.Tensor, start: int, cache: LeanCache, rope) -> torch.Tensor:
        n, heads, kv_heads, head_dim = h.shape[1], self.heads, self.kv_heads, self.head_dim
        end = start + n
        qk, v = layer.project(torch.rms_norm(h, layer.shape1, layer.w1, layer.eps1), n, head_dim)
        cos, sin = rope[0][None, :, None], rope[1][None, :, None]
        qk = qk * cos + qk.roll(head_dim // 2, -1) * sin  # transformers' q * cos + rotate_half(q) * sin, q and k
        keys, values = cache.extend(i, start, end, h, kv_heads, head_dim)
        keys[:, start:end] = qk[:, :, heads:]
        values[:, start:end] = v
        q, k, v = qk[:, :, :heads].transpose(1, 2), keys[:, :end].transpose(1, 2), values[:, :end].transpose(1, 2)
        if self.exact:
            a = lowbit_kernel.causal_attention(q, k, v, layer.scaling)
        else:  # torch's SDPA (a drafter off the kernel): the rows after a cache see it and the new rows up to theirs
            mask = None if n == 1 or start == 0 else torch.ones(n, end, dtype=torch.bool, device=h.device).tril(start)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0 and n > 1,
                                               scale=layer.scaling, enable_gqa=kv_heads != heads).transpose(1, 2)
        return h + layer.o(a.reshape(1, n, heads * head_dim))

    def head(self, h: torch.Tensor, keep: int, norm_first: bool = False) -> torch.Tensor:
        """The logits of the last `keep` rows: the final norm over every row first (as transformers' forward) or
        over the kept rows only (as SlimVerifier.head); both norm each row alone."""
        weight, shape, eps = self.norm.weight, self.norm.weight.shape, self.norm.variance_epsilon
        if self.kernel:  # torch.rms_norm's bits in one call
            kept = h.contiguous() if norm_first else h[:, -keep:].contiguous()
            normed = lowbit_kernel.rms_norm(kept, weight, eps)
            return self.lm_head(normed[:, -keep:] if norm_first else normed)
        if norm_first:
            return self.lm_head(torch.rms_norm(h, shape, weight, eps)[:, -keep:])
        return self.lm_head(torch.rms_norm(h[:, -keep:], shape, weight, eps))


class LeanDecoder:
    """A decoder run by a LeanNet over a KV cache of its own (core.cached.CachedModel's interface), skipping the sub-layers in
    `skip` (a slim verifier's route). `norm_first`: the final norm over every row fed, then the kept rows (as
    transformers' forward does), else over the kept rows (as routing.SlimVerifier.head): each gives its model's
    own bits."""

    def __init__(self, net, vocab_size: int, input_device, output_device, skip=frozenset(), norm_first: bool = False):
        """`net`: a LeanNet, or a model to run through one."""
        net = net if isinstance(net, LeanNet) else LeanNet(net)
        self.net, self.vocab_size, self.skip, self.norm_first = net, vocab_size, frozenset(skip), norm_first
        self.input_device, self.output_device = input_device, output_device
        self.cache, self.seen = net.new_cache(), 0
        self.head_context = HeadContext()  # this run's context tokens for a frequency-ranked head

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
        self.rollback(upto - keep)  # a position asked for again is fed again
        start, net = self.seen, self.net
        ids = torch.tensor([seq[start:upto]], device=self.input_device)
        with using_context(self.head_context):
            if hasattr(net.lm_head, "see"):  # a frequency-ranked head learns the context's tokens (heads.FrequentHead)
                net.lm_head.see(ids, start == 0)
            hidden = net.run(net.embed(ids), start, self.cache, range(net.sublayers), self.skip)
            logits = net.head(hidden, keep, self.norm_first)
        self.seen = upto
        return logits[0, :, : self.vocab_size].to(self.output_device)

    def rollback(self, length: int) -> None:
        """Forgets every cached token past `length`."""
        if self.seen > length:
            self.cache.crop_to(length)
            self.seen = length

    @torch.inference_mode()
    def fork(self) -> "LeanDecoder":
        """A copy with a cache of its own (the same model): a run starts from a cached opening (opening.py)."""
        twin = copy.copy(self)
        twin.cache = self.cache.fork()
        twin.head_context = replace(self.head_context)
        return twin
