"""VIA-SD: three-tier speculative decoding (drafter -> slim verifier -> full verifier).

    from via_sd import load_pair, generate, DecodeConfig, Thresholds, Trace
    pair = load_pair("embedded")
    trace = generate(pair, "prompt", method="via", config=DecodeConfig(gamma="auto"))

The engine imports neither gradio nor plotly. The public names below load on first use, so the pure
modules (`via_sd.core.plan`: the tier rule and the round plan; `via_sd.cost.model`: the cost model;
`via_sd.core.trace_check`) can be imported without torch, by `viz` and by pages that never load a model.
Importing it pins torch's CPU code path (via_sd/weights/numerics.py), so every entry point computes the same bits.
"""

from .core.lazy import lazy_names
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
__all__, __getattr__, __dir__ = lazy_names(__name__, globals(), _PUBLIC)
