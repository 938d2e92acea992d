"""VIA-SD: three-tier speculative decoding (drafter -> slim verifier -> full verifier).

    from via_sd import load_pair, generate, DecodeConfig, Thresholds, Trace
    pair = load_pair("embedded")
    trace = generate(pair, "prompt", method="via", config=DecodeConfig(gamma=5))

The engine imports neither gradio nor plotly.
"""

from .decoding import METHODS, DecodeConfig, Event, generate, stream, stream_events
from .models import PRESETS, ModelLoadError, ModelPair, load_pair, tiny_random_pair
from .route_search import measure_route, pick_route, route_for, search_curve, search_route
from .routing import Route, SlimVerifier
from .tiers import THRESHOLD_PRESETS, Thresholds, tier_of
from .trace import Trace

__all__ = ["DecodeConfig", "Event", "METHODS", "ModelLoadError", "ModelPair", "PRESETS", "Route", "SlimVerifier",
           "THRESHOLD_PRESETS", "Thresholds", "Trace", "generate", "load_pair", "measure_route", "pick_route",
           "route_for", "search_curve", "search_route", "stream", "stream_events", "tier_of", "tiny_random_pair"]
