"""Progressive verification: the slim and the full verifier as one network up to the route's first skip.

The sub-layers before the slim verifier's first skipped one are the same in both verifiers, so they run once
for both, with one KV cache, and a full pass after a slim pass resumes from the hidden states the slim pass
left there (routing.SlimVerifier runs any range of sub-layers). After the split each verifier has its own cache,
or the slim one reads the full one's (slim_cache="full", as SWIFT and LayerSkip share the target's cache).
"""

from __future__ import annotations

import copy

import torch
from .routing import SlimVerifier


def crop_cache(cache, length: int) -> None:
    """Forgets every cached position from `length` on, layer by layer (layers may be shared)."""
    if hasattr(cache, "crop_to"):  # the lean forward's (lean_cache.LeanCache)
        cache.crop_to(length)
        return
    for layer in cache.layers:
        held = layer.get_seq_length()
        if held > length:
            layer.crop(length - held)


class ProgressiveVerifier:
    """The slim and the full verifier as one network up to the route's first skipped sub-layer.

    Progressive verification: the sub-layers before that split run once for both, with one KV cache,
    and their output hidden states are kept for every position one of the two has not yet seen; a full
    pass after a slim pass (or a lazy catch-up) resumes from them instead of starting over. `view("slim")`
    and `view("full")` are the two verifiers, each with its own cache for the sub-layers after the split.
    """

    def __init__(self, slim: SlimVerifier, vocab_size: int, output_device, *, slim_cache: str):
        """`slim_cache`: "own" (the slim view keeps a cache of its own after the split) or "full" (it reads the
        full view's cache, as self-speculative methods (SWIFT, LayerSkip) share the target's: every position
        the full verifier has read is context for the slim one, which writes only positions past those)."""
        if slim_cache not in ("own", "full"):
            raise ValueError(f"slim_cache must be 'own' or 'full', got {slim_cache!r}")
        self.net, self.vocab_size, self.output_device = slim, vocab_size, output_device
        self.split = slim.first_skip
        self.cache, self.seen = slim.new_cache(), 0  # the shared sub-layers
        self.hidden: list[tuple[int, torch.Tensor]] = []  # (first position, hidden states at the split)
        self.views = {"slim": VerifierView(self, skip=True), "full": VerifierView(self, skip=False)}
        self.slim_reads_full = slim_cache == "full"
        if self.slim_reads_full:
            self.views["slim"].cache = self.views["full"].cache

    def view(self, name: str) -> "VerifierView":
        return self.views[name]

    @torch.inference_mode()
    def fork(self) -> "ProgressiveVerifier":
        """A copy with caches of its own (the same network): a run starts from a cached opening (opening.py).
        Kept hidden states are shared: nothing writes into them, later passes only add new ones."""
        twin = copy.copy(self)
        twin.cache, twin.hidden = copy.deepcopy(self.cache), list(self.hidden)
        twin.views = {}
        for name, view in self.views.items():
            twin.views[name] = copy.copy(view)
            twin.views[name].owner = twin
            twin.views[name].cache = copy.deepcopy(view.cache)
        if self.slim_reads_full:
            twin.views["slim"].cache = twin.views["full"].cache
        return twin

    def advance(self, seq: list[int], upto: int) -> None:
        """Runs the shared sub-layers over seq[seen:upto] and keeps their hidden states."""
        if self.seen < upto:
            ids = torch.tensor([seq[self.seen:upto]], device=self.net.device)
            h = self.net.run(self.net.embed(ids), self.seen, self.cache, range(self.split), skip=False)
            self.hidden.append((self.seen, h))
            self.seen = upto

    def hidden_states(self, start: int, stop: int) -> torch.Tensor:
        """The kept hidden states at the split for positions start..stop-1."""
        parts = [h[:, max(start, s) - s: min(stop, s + h.shape[1]) - s] for s, h in self.hidden
                 if s < stop and s + h.shape[1] > start]
        out = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        assert out.shape[1] == stop - start, "progressive verification lost hidden states it still needed"
        return out

    def forget(self) -> None:
        """Drops hidden states both verifiers have seen."""
        low = min(v.seen for v in self.views.values())
        kept = [(s, h) for s, h in self.hidden if s + h.shape[1] > low]
        self.hidden = [(max(s, low), h[:, max(low - s, 0):]) for s, h in kept]

    def rollback(self, length: int) -> None:
        if self.seen > length:
            crop_cache(self.cache, length)
            self.seen = length
            self.hidden = [(s, h[:, : length - s]) for s, h in self.hidden if s < length]
        for v in self.views.values():
            v.drop(length)


class VerifierView:
    """One of the two verifiers of a ProgressiveVerifier: the sub-layers after the split, its own cache."""

    def __init__(self, owner: ProgressiveVerifier, skip: bool):
        self.owner, self.skip = owner, skip
        self.cache, self.seen = owner.net.new_cache(), 0

    @torch.inference_mode()
    def logits(self, seq: list[int], upto: int, keep: int) -> torch.Tensor:
        """Feeds seq[seen:upto] and returns the logits of the last `keep` fed positions, [keep, V]."""
        owner, net = self.owner, self.owner.net
        if self.seen > upto - keep:  # a position asked for again is fed again
            owner.rollback(upto - keep)
        owner.advance(seq, upto)
        h = owner.hidden_states(self.seen, upto)
        shared = owner.slim_reads_full and not self.skip
        if shared:  # the slim view's positions past the full view's are the slim network's: the full one redoes them
            crop_cache(self.cache, self.seen)
        h = net.run(h, self.seen, self.cache, range(owner.split, net.sublayers), self.skip)
        self.seen = upto
        if shared:  # everything the full view has read is now the slim view's context too
            owner.views["slim"].seen = upto
        owner.forget()
        return net.head(h, keep)[0, -keep:, : owner.vocab_size].to(owner.output_device)

    def drop(self, length: int) -> None:
        if self.seen > length:
            crop_cache(self.cache, length)
            self.seen = length

    def rollback(self, length: int) -> None:
        """Forgets every position past `length` (in the shared sub-layers too)."""
        self.owner.rollback(length)
