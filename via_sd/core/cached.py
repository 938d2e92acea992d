"""A model with its own KV cache, fed lazily, and a clock that is true on a GPU.

`CachedModel` wraps anything callable like a HF causal LM; `LeanDecoder` runs a Llama / Qwen2 decoder (full, or with
a route's sub-layers skipped) through the lean forward (weights/lean_forward.py), with the same interface, and
`model_cache` / `drafter_cache` pick one; `Reader` wraps a CachedModel or one view
of a ProgressiveVerifier (progressive.py) and is what the decoders call: it reads the prompt in a call
of its own before anything past it (as AR's first call does), so every later position is fed as a
pass that extends a cache (with row attention, bit for bit what one-token steps compute: greedy SD
== greedy AR), and it records every forward it makes (model, rows fed, rows already cached, whether
it read the prompt) so a run's cost can be priced call by call (via_sd.cost.model.price_calls). A model
may start a run with the chat template's opening already read (opening.py): it reads the rest of
the prompt as its own call, as every method does.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import replace

import torch
from transformers import DynamicCache

from ..weights.heads import HeadContext, using_context
from ..weights.lean_forward import LeanDecoder, LeanNet, exact, supports
from ..weights.row_attention import reading_prompt


class Clock:
    """Milliseconds since start; synchronizes CUDA first so GPU work is really finished."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.t0 = time.perf_counter()

    def ms(self) -> float:
        if self.cuda:  # every GPU: a verifier may be spread over several
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
        return (time.perf_counter() - self.t0) * 1000.0


class CachedModel:
    """One model with its own KV cache, and how many tokens of the sequence that cache holds."""

    def __init__(self, forward, vocab_size: int, input_device, output_device):
        self.forward = forward
        self.vocab_size = vocab_size
        self.input_device, self.output_device = input_device, output_device
        self.cache = DynamicCache()
        self.seen = 0
        self.head_context = HeadContext()  # this run's context tokens, if the model's head keeps any

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
        self.rollback(upto - keep)  # a position asked for again is fed again
        ids = torch.tensor([seq[self.seen:upto]], device=self.input_device)
        with using_context(self.head_context):
            out = self.forward(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.seen = upto
        # a verifier spread over several GPUs returns logits on its last one
        return out.logits[0, -keep:, : self.vocab_size].to(self.output_device)

    def rollback(self, length: int) -> None:
        """Forgets every cached token past `length`."""
        if self.seen > length:
            self.cache.crop(length - self.seen)
            self.seen = length

    @torch.inference_mode()
    def fork(self) -> "CachedModel":
        """A copy with a cache of its own (the same model): a run starts from a cached opening (opening.py)."""
        twin = copy.copy(self)
        twin.cache = copy.deepcopy(self.cache)
        twin.head_context = replace(self.head_context)
        return twin


class Reader:
    """What a decoder calls: `model` (a CachedModel or a VerifierView), the prompt read on its own, every
    forward recorded in `calls` as {"model", "rows", "past", "resume", "prompt"}, and with a `clock` its "ms" (what
    the pass took: the evidence that keeps a cost profile honest, via_sd.core.profile)."""

    def __init__(self, model, name: str, prompt: int, calls: list, clock: Clock | None = None):
        self.model, self.name, self.prompt, self.calls, self.clock = model, name, prompt, calls, clock
        self.trunk_owner = getattr(model, "owner", None)  # a ProgressiveVerifier's view: its shared sub-layers
        self.trunk = self.trunk_owner if self.trunk_owner is not None and not model.skip else None

    @property
    def seen(self) -> int:
        return self.model.seen

    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] (after forgetting anything past upto - keep) and returns the logits of the last
        `keep` positions, [keep, V]; a read from a cache that lacks part of the prompt, past the prompt's end,
        reads the rest of the prompt alone first."""
        if (self.name == "slim" and self.seen < self.prompt - 1 <= upto - keep
                and getattr(self.trunk_owner, "slim_reads_full", False)):
            # the slim verifier reads the full one's cache: the full one reads the prompt (but its last token, whose
            # logits the slim one needs: its pass starts there), once for both
            full = Reader(self.trunk_owner.view("full"), "full", self.prompt, self.calls, self.clock)
            full.logits(seq, self.prompt - 1, 1)
        start = min(self.seen, upto - keep)
        # the slim view that reads the full one's cache lacks only the prompt's last token: its own pass starts there
        lacks_prompt = start == 0 or start < self.prompt - 1
        if lacks_prompt and self.prompt < upto:  # the rest of the prompt first (past it, a pass extends a cache)
            inside = max(0, self.prompt - (upto - keep))  # asked-for positions in the prompt
            first = self._read(seq, self.prompt, max(inside, 1), start)
            return torch.cat([first[first.shape[0] - inside:], self._read(seq, upto, keep - inside, self.prompt)])
        return self._read(seq, upto, keep, start)

    def _read(self, seq, upto: int, keep: int, start: int) -> torch.Tensor:
        resume = self.trunk is not None and self.trunk.seen >= upto  # the shared sub-layers ran already
        prompt = upto <= self.prompt  # reading the prompt (after a cached opening too: opening.py)
        call = {"model": self.name, "rows": upto - start, "past": start, "resume": resume, "prompt": prompt}
        self.calls.append(call)
        begin = self.clock.ms() if self.clock is not None else None
        with reading_prompt() if prompt else nullcontext():
            logits = self.model.logits(seq, upto, keep)
        if begin is not None:
            call["ms"] = round(self.clock.ms() - begin, 3)
        return logits

    def rollback(self, length: int) -> None:
        self.model.rollback(length)


def drafter_cache(model, vocab_size: int, input_device, output_device):
    """The drafter's cached model: the lean forward (weights/lean_forward.py) when it supports the model, else
    transformers' forward."""
    if supports(model):
        return LeanDecoder(model, vocab_size, input_device, output_device)
    return CachedModel(model, vocab_size, input_device, output_device)


def model_cache(model, vocab_size: int, input_device, output_device):
    """A verifier's cached model: `model` (a HF causal LM, or a routing.SlimVerifier: its route's sub-layers skipped)
    through the lean forward where that gives its own forward's bits (its linears on the project's kernel), else
    through its own forward."""
    slim = hasattr(model, "skip_set")
    net = model.lean if slim else (LeanNet(model) if exact(model) else None)
    if net is None:
        return CachedModel(model, vocab_size, input_device, output_device)
    return LeanDecoder(net, vocab_size, input_device, output_device, model.skip_set if slim else (), not slim)
