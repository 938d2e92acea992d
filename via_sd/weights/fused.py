"""Fewer, larger int4 matmuls: a layer's q / k / v projections as one, its gate / up projections as one.

gpt-fast fuses `wqkv` and `w1`/`w3` in the checkpoint; here the model's own modules stay where
transformers calls them: each of q_proj, k_proj, v_proj becomes a `FusedPart` of one `FusedInt4`,
whose stacked Int4Linear runs once for the input the first part is given, and the others are served
slices of that output (the same tensor object in means the same rows; anything else is recomputed), each
thread its own: threads running one model at once never read each other's output.
torch's int4 kernel computes every output feature on its own, so the slices are bit for bit what
the separate layers give (tests/test_lowbit.py). Small matrices run far below the bandwidth large
ones reach, so one call instead of three (or two) is cheaper: measured in benchmarks/weights_passes.py.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from .linears import BLOCK_N, Int4Linear

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedInt4(nn.Module):
    """Int4Linear layers over one input, stacked into one; `part(i, x)` is layer i's output for x."""

    def __init__(self, parts: list[Int4Linear]):
        super().__init__()
        self.layer = Int4Linear.stacked(parts)
        ends = torch.tensor([p.out_features for p in parts]).cumsum(0).tolist()
        self.bounds = list(zip([0, *ends[:-1]], ends))
        self._calls: dict = {}  # thread id -> (input, output, parts served); a threading.local cannot be deep-copied

    def part(self, i: int, x: torch.Tensor) -> torch.Tensor:
        thread = threading.get_ident()
        seen, y, served = self._calls.get(thread, (None, None, set()))
        if x is not seen or i in served:
            y, served = self.layer(x), set()
        served.add(i)
        if len(served) == len(self.bounds):  # every part served: hold no activations
            self._calls.pop(thread, None)
        else:
            self._calls[thread] = (x, y, served)
        lo, hi = self.bounds[i]
        return y[..., lo:hi]


class FusedPart(nn.Module):
    """Stands where one of the fused layers stood; reads its slice of the fused output."""

    def __init__(self, fused: FusedInt4, index: int):
        super().__init__()
        self.fused, self.index = fused, index
        lo, hi = fused.bounds[index]
        self.in_features, self.out_features = fused.layer.in_features, hi - lo

    @property
    def weight(self) -> torch.Tensor:
        """The fused layer's packed codes (callers read .device / .dtype off a module's `weight`)."""
        return self.fused.layer.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)

    def extra_repr(self) -> str:
        return f"part {self.index} of {self.fused.layer.out_features} fused outputs"


def _stackable(layer) -> bool:
    return type(layer) is Int4Linear and layer.out_features % BLOCK_N == 0


def fuse_linears(model: nn.Module) -> int:
    """Fuses every q/k/v and gate/up group (its Int4Linear members, when two or more share an input
    width) in place; returns how many groups were fused."""
    count = 0
    for module in list(model.modules()):
        for names in GROUPS:
            parts = [n for n in names if _stackable(getattr(module, n, None))]
            widths = {getattr(module, n).in_features for n in parts}
            if len(parts) < 2 or len(widths) != 1:
                continue
            try:
                fused = FusedInt4([getattr(module, n) for n in parts])
            except ValueError:  # a packed layout this build does not share with _unpack
                continue
            for i, name in enumerate(parts):
                setattr(module, name, FusedPart(fused, i))
            count += 1
    return count
