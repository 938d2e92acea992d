"""The lean forward's KV cache (lean_forward.py): keys and values per layer in preallocated buffers, grown by
doubling, cropped by a length, never concatenated."""

from __future__ import annotations

import torch

FIRST_CAPACITY = 256  # cache rows allocated at first; doubled whenever a pass needs more


def grown(held: int, end: int) -> int:
    """Rows a buffer holding `held` rows grows to for a pass reaching `end` (the KV buffers, the RoPE table)."""
    return max(FIRST_CAPACITY, 2 * held, end)


class LeanCache:
    """Keys and values per layer in buffers [1, capacity, kv_heads, head_dim] (grown by doubling), and how many
    positions each layer holds: a layer a route skips holds none, or fewer (as in transformers' DynamicCache)."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.lengths = [0] * layers

    def get_seq_length(self, layer: int = 0) -> int:
        return self.lengths[layer]

    def crop_to(self, length: int) -> None:
        """Forgets every position from `length` on (the buffers' rows are written over later)."""
        self.lengths = [min(n, length) for n in self.lengths]

    def extend(self, layer: int, start: int, end: int, like: torch.Tensor, kv_heads: int, head_dim: int):
        """Layer `layer`'s buffers, holding at least `end` rows, for positions start..end-1 to be written."""
        if self.lengths[layer] != start:
            raise RuntimeError(f"layer {layer} of the KV cache holds {self.lengths[layer]} positions, but a pass "
                               f"from position {start} was asked for")
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or keys.shape[1] < end:
            size = grown(0 if keys is None else keys.shape[1], end)
            bigger = [torch.empty((1, size, kv_heads, head_dim), dtype=like.dtype, device=like.device) for _ in "kv"]
            if keys is not None:
                bigger[0][:, :start], bigger[1][:, :start] = keys[:, :start], values[:, :start]
            keys, values = self.keys[layer], self.values[layer] = bigger
        self.lengths[layer] = end
        return keys, values

    def fork(self) -> "LeanCache":
        """A copy with buffers of its own."""
        twin = LeanCache(0)
        twin.keys = [None if t is None else t.clone() for t in self.keys]
        twin.values = [None if t is None else t.clone() for t in self.values]
        twin.lengths = list(self.lengths)
        return twin

    def __deepcopy__(self, memo) -> "LeanCache":
        return self.fork()
