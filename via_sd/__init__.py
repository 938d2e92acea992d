"""VIA-SD: three-tier speculative decoding (drafter -> slim verifier -> full verifier).

    from via_sd import load_pair, generate, DecodeConfig, Thresholds, Trace
    pair = load_pair("embedded")
    trace = generate(pair, "prompt", method="via", config=DecodeConfig(gamma="auto"))

The engine imports neither gradio nor plotly. The public names below load on first use, so the pure
modules (`via_sd.core.plan`: the tier rule and the round plan; `via_sd.cost.model`: the cost model;
`via_sd.core.trace_check`) can be imported without torch, by `viz` and by pages that never load a model.
Importing it pins torch's CPU code path (via_sd/weights/numerics.py), so every entry point computes the same bits.
"""

from importlib import import_module

from .weights.numerics import pin

pin()  # before anything of ours loads torch: one ATen code path on every x86 machine (weights/numerics.py)

_PUBLIC = {
    "core.decoding": ("METHODS", "Event", "generate", "stream", "stream_events"),
    "core.config": ("DecodeConfig",),
    "core.catalog": ("PRESETS", "NO_ROUTE", "ModelLoadError", "NoRouteWarning"),
    "core.pair": ("ModelPair", "load_pair", "tiny_random_pair"),
    "route_search": ("measure_route", "pick_route", "route_for", "search_curve", "search_route"),
    "core.routing": ("Route", "SlimVerifier"),
    "core.plan": ("THRESHOLD_PRESETS", "Thresholds", "tier_of"),
    "core.trace": ("Trace",),
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'via_sd' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
