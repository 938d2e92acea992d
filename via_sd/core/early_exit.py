"""The early-exit drafter (self-speculation): the verifier's first layers, its final norm and head.

Its cost per token on this machine is measured once per pair and exit layer and cached next to the pair's cost
profile (via_sd.core.profile), as that profile measures the model drafter: steps after a 200-token context, each
timed right after a one-token verifier step and kept as a ratio to it (a VM's speed drifts between probes timed
apart), the median of the ratios times the profile's verify(1). (Prompt lookup's cost, a search in Python, is
timed in the process: lookup.lookup_ms.)
"""

from __future__ import annotations

import json
import logging
import statistics
import threading

import torch

from .cached import Clock, model_cache
from .profile import CONTEXT, profile_key, profile_path
from .progressive import ProgressiveVerifier
from .routing import Route, SlimVerifier

log = logging.getLogger("via_sd.core.early_exit")
SWEEPS = 7
_lock = threading.Lock()
_MEASURED: dict = {}


class EarlyExitNet(SlimVerifier):
    """The verifier's embedding, first `layer` layers, final norm and head: a SlimVerifier that skips every
    sub-layer from layer `layer` on (a route may never skip the last layer; an early exit does by design)."""

    def __init__(self, verifier, layer: int):
        n = verifier.config.num_hidden_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < n:
            raise ValueError(f"exit_layer must be a whole number from 1 to {n - 1} (the verifier has {n} layers), "
                             f"got {layer!r}")
        super().__init__(verifier, Route("none", (), n))
        self.route = Route(f"early-exit-{layer}", (), n)
        self.layer = layer
        self.skipped = [k >= 2 * layer for k in range(2 * n)]
        self.skip_set = frozenset(k for k, s in enumerate(self.skipped) if s)


def default_exit_layer(num_layers: int) -> int:
    """Half the verifier's layers (LayerSkip's models were trained to exit early; an untrained one needs depth)."""
    return max(1, num_layers // 2)


def exit_layer_of(config, verifier) -> int:
    n = verifier.config.num_hidden_layers
    return config.exit_layer or default_exit_layer(n)


def early_exit_verifier(verifier, layer: int, vocab: int, device) -> ProgressiveVerifier:
    """One network split at the exit: view("slim") drafts (the first layers and the head), view("full") verifies,
    resuming from the drafted positions' hidden states; one KV cache for the shared layers."""
    return ProgressiveVerifier(EarlyExitNet(verifier, layer), vocab, device, slim_cache="own")


def exit_draft_ms(pair, layer: int, refresh: bool = False) -> tuple:
    """draft_ms (k = 1..3 rows) of the early exit after `layer` layers: cached, or measured now (seconds)."""
    # the profile's own verify(1) in the key: a profile measured again (another kernel) measures the exit again
    key = {**profile_key(pair), "drafter": f"early-exit-{layer}", "verify_ms": round(pair.costs.verify(1), 3)}
    path = profile_path(key)
    with _lock:
        if not refresh and path in _MEASURED:
            return _MEASURED[path]
        if not refresh and path.exists():
            try:
                data = json.loads(path.read_text())
                if data.get("key") == key:
                    _MEASURED[path] = tuple(float(x) for x in data["draft_ms"])
                    return _MEASURED[path]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        ms = _MEASURED[path] = measure_exit(pair, layer)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": key, "draft_ms": list(ms)}) + "\n")
        except OSError as err:
            log.warning("could not cache the early exit's cost at %s: %s", path, err)
        return ms


@torch.inference_mode()
def measure_exit(pair, layer: int) -> tuple:
    clock, vocab, out = Clock(pair.device), pair.vocab_size, pair.drafter.device
    seq = torch.randint(0, vocab, (CONTEXT + 8,), generator=torch.Generator().manual_seed(0)).tolist()
    full = model_cache(pair.verifier, vocab, out, out)
    net = EarlyExitNet(pair.verifier, layer)
    exit_ = model_cache(net, vocab, net.device, out)
    for model in (full, exit_):
        model.logits(seq, CONTEXT, 1)
        model.logits(seq, CONTEXT + 1, 1)  # warm

    def step(model, k):
        model.rollback(CONTEXT)
        start = clock.ms()
        model.logits(seq, CONTEXT + k, k)
        return clock.ms() - start

    ratios = {k: [] for k in (1, 2, 3)}
    for _ in range(SWEEPS):
        for k in ratios:
            one = step(full, 1)
            ratios[k].append(step(exit_, k) / one)
    base = pair.costs.verify(1)
    ms = [statistics.median(ratios[k]) * base for k in (1, 2, 3)]
    return tuple(max(ms[: i + 1]) for i in range(3))  # more rows never cost less
