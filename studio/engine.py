"""The engine's heavy functions, imported on first call.

app.py serves the page before torch and transformers are imported: they load in the load thread, beside the
browser drawing the page (about 4 s of a start on two cores), not before the server answers. A studio module
names what it calls from the engine here, and tests replace those names as they would any module function."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy(module: str, name: str) -> Callable:
    """`module.name`, imported when first called."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name}, imported on first call (studio.engine)."
    return call


# studio.models: the pair's load, its routes, its warm-up
generate, load_pair = lazy("via_sd.core.decoding", "generate"), lazy("via_sd.core.pair", "load_pair")
pick_route, default_device = lazy("via_sd.route_search", "pick_route"), lazy("via_sd.core.pair", "default_device")
SlimVerifier, resolve_route = lazy("via_sd.core.routing", "SlimVerifier"), lazy("via_sd.core.routing", "resolve_route")
has_prior, profile_for = lazy("via_sd.core.profile", "has_prior"), lazy("via_sd.core.profile", "profile_for")
resolve_weights = lazy("via_sd.weights.settings", "resolve_weights")
# studio.runs, studio.batch, studio.lab, studio.own_pair: runs, batches and route searches
stream_events, learn = lazy("via_sd.core.decoding", "stream_events"), lazy("via_sd.core.profile", "learn")
measure_fidelities = lazy("via_sd.bench.fidelity", "measure_fidelities")
run_bench, run_sweep = lazy("via_sd.bench", "run_bench"), lazy("via_sd.bench", "run_sweep")
route_for, how_made = lazy("via_sd.route_search", "route_for"), lazy("via_sd.route_search", "how_made")


def kernel_module():
    """via_sd.weights.lowbit_kernel (imports torch)."""
    return importlib.import_module("via_sd.weights.lowbit_kernel")


def cuda_available() -> bool:
    return importlib.import_module("torch").cuda.is_available()


def empty_cuda_cache() -> None:
    torch = importlib.import_module("torch")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
