"""A route made by a rule, for a verifier nobody has searched a route for yet: no calibration, no search."""

from __future__ import annotations

from .routing import Route

SHARE = 0.25  # of the middle layers; attention holds few weights, so this stays close to the full verifier


def provisional_route(num_layers: int, share: float = SHARE) -> Route:
    """Skips the attention sub-layers of an evenly spaced `share` of the middle layers (never the first or
    last layer). Its `meta` says it is provisional and how it was made."""
    middle = list(range(1, num_layers - 1))
    count = min(max(1, round(share * len(middle))), len(middle))
    layers = sorted({middle[int((i + 0.5) * len(middle) / count)] for i in range(count)}) if middle else []
    meta = {"provisional": True, "rule": {"skip": "attn", "share_of_middle_layers": share},
            "method": f"provisional: the attention sub-layers of {len(layers)} evenly spaced middle layers skipped "
                      f"(a rule, no search); search a measured route with `python -m via_sd route`"}
    return Route("provisional", tuple(f"attn.{k}" for k in layers), num_layers, meta)
