"""The ends of a low-bit model: the embedding table, and output heads that re-score or narrow the vocabulary.

    LowbitEmbedding  the GGUF's codes with per-group scale / offset; only looked-up rows are de-quantized
    RescoredHead     a verifier's int4 head whose best k logits are re-scored exactly (its top-1 is exact)
    FrequentHead     a drafter's head over the N most frequent tokens only (FR-Spec, arXiv 2502.14856)
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

from . import lowbit_kernel
from .linears import Int4Linear, pack_nibbles, unpack_nibbles


@dataclass
class HeadContext:
    """One run's context tokens for a FrequentHead: the tokens it was fed that the frequency list lacks, and the
    head rows that score them. It belongs to the run's drafter cache (cached.CachedModel, lean.LeanDecoder), never
    to the shared head, so runs on one pair in several threads never see each other's tokens. Fields are
    replaced, never changed in place: a fork (`dataclasses.replace`) shares nothing that later changes."""

    seen: frozenset = frozenset()
    ids: torch.Tensor | None = None
    layer: Int4Linear | None = None


# The context of the run whose forward is under way (set by the run's cache around each forward, in its thread).
RUN_CONTEXT: ContextVar[HeadContext | None] = ContextVar("via_sd_head_context", default=None)


@contextmanager
def using_context(context: HeadContext):
    """Runs the forwards inside with `context` as the drafter head's context."""
    token = RUN_CONTEXT.set(context)
    try:
        yield
    finally:
        RUN_CONTEXT.reset(token)


class RescoredHead(nn.Module):
    """An output head in low-bit weights whose best `k` logits are re-scored exactly.

    The low-bit head scores the whole vocabulary (fast, bf16-rounded: at a logit of 20 a bf16 step is
    0.125, wider than many top-1 / top-2 gaps); then the `k` best rows are de-quantized exactly
    (`exact_rows(ids) -> float32 [..., k, hidden]`, e.g. from the GGUF codes) and their logits
    recomputed in fp32. Every other logit is clamped strictly below the lowest re-scored one, so the
    argmax is always a re-scored token (re-scoring can lower all k below the low-bit logit of token
    k + 1; that token, never re-scored, must not win). So the top token is the exact weights' top token
    unless that one fell outside the low-bit top k. Every row is computed on its own, whatever the batch."""

    def __init__(self, head: nn.Module, exact_rows, k: int = 16):
        super().__init__()
        self.head, self.exact_rows, self.k = head, exact_rows, min(k, head.out_features)

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    @property
    def out_features(self) -> int:
        return self.head.out_features

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.rescore(self.head(h), h)

    def rescore(self, logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """`logits`: the low-bit head's fresh output for `h` (changed in place)."""
        top = best_k(logits, self.k)
        exact = (self.exact_rows(top) * h.float().unsqueeze(-2)).sum(-1)
        if self.head.bias is not None:
            exact = exact + self.head.bias[top]
        floor = torch.nextafter(exact.amin(-1, keepdim=True), torch.tensor(float("-inf")))
        torch.minimum(logits, floor, out=logits)
        return logits.scatter_(-1, top, exact)


CHUNK = 128  # logits per chunk in best_k's first look


def best_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the `k` largest logits of each row: the set `logits.topk(k)` gives (in another order), at a
    fraction of its cost over a large vocabulary. topk sorts (value, index) pairs of the whole row; here the row's
    chunks of CHUNK logits are ranked by their maxima, and the k largest logits lie in the k chunks with the largest
    maxima (k distinct logits are at least the k-th largest maximum, and no logit of another chunk reaches it), so
    topk runs over k * CHUNK of them (and a tail of fewer than CHUNK). Where that set is not unique (a tie at the k-th
    logit, or a NaN, which topk ranks first), or two chunk maxima tie at the k-th, the whole row's topk decides,
    as before. Where the project's kernel is built, head_rows.cpp's best_k_rows does all of it in one call (a dozen
    small ATen operations cost more than the search, right after the head's matmul)."""
    vocab = logits.shape[-1]
    chunks = vocab // CHUNK
    if chunks < 2 * k:
        return logits.topk(k, dim=-1).indices
    rows = logits.reshape(-1, vocab)
    if lowbit_kernel.available() and rows.dtype == torch.float32 and rows.device.type == "cpu" and rows.stride(-1) == 1:
        return lowbit_kernel.module().best_k_rows(rows, k, CHUNK).view(*logits.shape[:-1], k)  # one call: head_rows.cpp
    maxima = rows[:, :chunks * CHUNK].view(-1, chunks, CHUNK).amax(-1)
    ranked = maxima.topk(k + 1, dim=-1)
    if bool(maxima.isnan().any()) or not bool((ranked.values[:, k - 1] > ranked.values[:, k]).all()):
        return logits.topk(k, dim=-1).indices
    picked = ranked.indices[:, :k]
    near = rows.view(-1, vocab)[:, :chunks * CHUNK].view(-1, chunks, CHUNK).gather(
        1, picked[..., None].expand(-1, -1, CHUNK)).view(rows.shape[0], k * CHUNK)
    tail = rows[:, chunks * CHUNK:]
    if tail.shape[1]:
        near = torch.cat([near, tail], 1)
    best = near.topk(k + 1, dim=-1)
    if bool(best.values.isnan().any()) or not bool((best.values[:, k - 1] > best.values[:, k]).all()):
        return logits.topk(k, dim=-1).indices
    at = best.indices[:, :k]
    inside = at < k * CHUNK
    ids = torch.where(inside, picked.gather(1, (at // CHUNK).clamp(max=k - 1)) * CHUNK + at % CHUNK,
                      chunks * CHUNK + at - k * CHUNK)
    return ids.view(*logits.shape[:-1], k)


class FrequentHead(nn.Module):
    """A drafter's output head that scores only `ids`, the N most frequent tokens; every other logit is
    the lowest finite float (probability exactly 0 after softmax, and no inf for code that takes logs or
    checks logits for finite values). One int4 matmul over N rows instead of the whole vocabulary
    (151,936 x 896 on the embedded drafter: the largest single matmul of a drafter step).

    What changes for speculative decoding: the drafter never proposes a token outside the N, and its
    distribution p is renormalised over them, so p(x) of a proposed token rises by the probability mass
    the full head gave the rest (small when N covers the text's tokens). Lossless either way: the
    verifier decides every token (greedy SD keeps a draft iff it is the verifier's argmax; sampled SD's
    rejection rule stays exact for any p with p(x) > 0 where a draft x is proposed). In VIA-SD's draft
    signal p(x) is the confidence that sorts drafts into tiers, so p(x) a little higher means a draft is
    a little more often kept without a verifier (tier A): thresholds tuned on the full head are slightly
    more permissive on this one. The verifier's head is never narrowed.

    The context's own tokens join the N (`see`, called by the hook `watch` installs on the drafter): a
    reply echoes words of its prompt (names, rare words) that no frequency list holds; the rows of the
    tokens seen since the last prompt read are scored by a second, small int4 matmul. Those tokens are the
    run's (HeadContext, held by the run's drafter cache), not the head's."""

    def __init__(self, head: Int4Linear, ids: torch.Tensor):
        super().__init__()
        ids = torch.as_tensor(ids, dtype=torch.long).sort().values
        self.vocab = head.out_features
        self.head = head.select_rows(ids)
        self.register_buffer("ids", ids, persistent=False)
        self.full, self._listed = head, frozenset(ids.tolist())  # the whole head: rows for context tokens
        self.outside_runs = HeadContext()  # the context of forwards run outside a run's cache (direct calls)

    def active(self) -> HeadContext:
        """The context of the forward under way: its run's (RUN_CONTEXT), else the one for direct calls."""
        return RUN_CONTEXT.get() or self.outside_runs

    @property
    def context_ids(self) -> torch.Tensor | None:
        return self.active().ids

    def see(self, input_ids: torch.Tensor, new_sequence: bool) -> None:
        """Tokens fed to the drafter that the list lacks join the head (forgotten at a new prompt)."""
        context = self.active()
        seen = frozenset() if new_sequence else context.seen
        new = set(input_ids.reshape(-1).tolist()) - self._listed - seen
        if new_sequence:
            context.seen, context.ids, context.layer = seen, None, None
        if not new:
            return
        ids = sorted(seen | new)
        ids += ids[:1] * (-len(ids) % 16)  # the kernel takes multiples of 16 rows; a repeat scores the same
        context.seen, context.ids = seen | new, torch.tensor(ids)
        context.layer = self.full.select_rows(context.ids)

    def watch(self, model: nn.Module):
        """Feeds `see` with every input of `model` (a prompt read, i.e. an empty cache, starts afresh)."""
        def before(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            cache = kwargs.get("past_key_values")
            if ids is not None:
                self.see(ids, cache is None or cache.get_seq_length() == 0)

        return model.register_forward_pre_hook(before, with_kwargs=True)

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    @property
    def out_features(self) -> int:
        return self.vocab

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        small = self.head(h)
        out = torch.full((*small.shape[:-1], self.vocab), torch.finfo(small.dtype).min, dtype=small.dtype)
        out.index_copy_(-1, self.ids, small)
        context = self.active()
        if context.layer is not None:
            out.index_copy_(-1, context.ids, context.layer(h))
        return out

    def extra_repr(self) -> str:
        return f"{len(self.ids)} of {self.vocab} tokens, and the context's"


class LowbitEmbedding(nn.Module):
    """An embedding table kept as integer codes with per-group scale / offset (as the GGUF stores
    it); only the looked-up rows are de-quantized."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, zero: int, group: int,
                 padding_idx=None, packed: bool = False):
        """`packed`: `codes` already holds 4-bit codes two to a byte (low nibble = even column)."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape[0], codes.shape[1] * (2 if packed else 1)
        self.zero, self.group, self.padding_idx = zero, group, padding_idx
        self.nibbles = packed or int(codes.max()) < 16  # 4-bit codes: two to a byte
        if self.nibbles and not packed:
            codes = pack_nibbles(codes)
        self.codes = nn.Parameter(codes.to(torch.uint8).contiguous(), requires_grad=False)
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("offset", None if offset is None else offset.float().contiguous())

    @property
    def weight(self) -> torch.Tensor:
        return self.codes

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)  # index_select: torch's advanced indexing of uint8 rows is slow on two threads
        q = self.codes.index_select(0, flat).view(*ids.shape, -1)
        if self.nibbles:
            q = unpack_nibbles(q)
        q = q.float() - self.zero
        q = q.view(*ids.shape, -1, self.group) * self.scale.index_select(0, flat).view(*ids.shape, -1)[..., None]
        if self.offset is not None:
            q = q + self.offset.index_select(0, flat).view(*ids.shape, -1)[..., None]
        return q.view(*ids.shape, self.embedding_dim)
