"""The chat template's opening, read once per pair: every run starts from copies of caches that hold it.

Every chat prompt of a pair begins with the same tokens: the template's system turn and the opening of
the user's turn (24 tokens for the embedded Qwen pair, 13-52% of the held-out prompts). Reading a
prompt is compute-bound on a CPU (the embedded verifier ~9 ms a token, the drafter ~3 ms) and a fifth
to a third of a 64-token run, so each model reads that opening once per pair (the first run that needs
it, before its clock starts) into a cache kept here, and every run starts from a copy (`fork`) and
reads only the rest of its prompt: prefix caching, for the one prefix every chat prompt shares.

Every method starts from the same copies and reads the rest of the prompt in a call of its own
(cached.Reader), as a prompt read (row_attention.reading_prompt), so greedy SD still equals greedy AR
token for token; fidelity.py reads the prompt the same way. `DecodeConfig(reuse_opening=False)` reads
every prompt whole, for comparison.
"""

from __future__ import annotations

import threading

import torch

from ..weights.heads import using_context
from ..weights.row_attention import reading_prompt

SENTINEL = "\x00via-sd\x00"  # a user message no template rewrites: the opening is the text before it


def opening_ids(tokenizer) -> list[int]:
    """The token ids every chat prompt of `tokenizer` begins with ([] without a chat template)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # a template that refuses a lone user turn: no opening to share
        return []
    if not isinstance(text, str) or SENTINEL not in text:
        return []
    return list(tokenizer(text[: text.index(SENTINEL)], add_special_tokens=False).input_ids)


def shared_length(opening: list[int], prompt_ids: list[int]) -> int:
    """How many of the prompt's first tokens a cached opening can stand for: their common start, leaving at least
    two prompt tokens to read (the rest of a prompt is then always a call of its own, cached.Reader)."""
    n = 0
    for a, b in zip(opening, prompt_ids):
        if a != b:
            break
        n += 1
    return max(0, min(n, len(prompt_ids) - 2))


class Openings:
    """A pair's chat opening, read once into each kind of cache a run starts from."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.read: dict = {}  # key -> a cache that has read the opening (forked, never fed itself)
        self._lock = threading.Lock()

    @property
    def ids(self) -> list[int]:
        """The opening's token ids, from the tokenizer's chat template as it is now."""
        template = getattr(self.tokenizer, "chat_template", None)
        if getattr(self, "_template", False) != template:  # first use, or a template set since: read afresh
            self._ids, self._template, self.read = opening_ids(self.tokenizer), template, {}
        return self._ids

    def start(self, key, fresh, prompt_ids: list[int], module=None):
        """A cache for a run on `prompt_ids`: a fork of the one kept under `key` (made with `fresh()`, a new
        CachedModel / LeanDecoder / ProgressiveVerifier, the first time), holding as much of the opening as the
        prompt begins with; `fresh()` itself when it begins with none. `module`: the model, whose frequency-ranked
        head (heads.FrequentHead) then starts its context from the opening's tokens."""
        n = shared_length(self.ids, prompt_ids)
        if n == 0:
            return fresh()
        with self._lock:  # two runs starting at once read the opening once
            if key not in self.read:
                self.read[key] = self._read_opening(fresh())
        model = self.read[key].fork()
        model.rollback(n)
        see = getattr(getattr(module, "lm_head", None), "see", None)
        if see is not None:  # the drafter's narrowed head: this run's context starts from the opening's tokens
            with using_context(model.head_context):
                see(torch.tensor([self.ids[:n]]), True)
        return model

    def _read_opening(self, model):
        n = len(self.ids)
        views = getattr(model, "views", None)  # a ProgressiveVerifier: both verifiers read it
        with reading_prompt():
            for reader in ([views["full"], views["slim"]] if views else [model]):
                if reader.seen < n:
                    reader.logits(self.ids, n, 1)
        return model
