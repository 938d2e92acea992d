"""One palette for tokens and figures: Okabe-Ito, color-blind safe, fine on light and dark.

Every emitted token and every plotted candidate gets one plain-words label; a label has one color
everywhere (token highlighting, legends, confidence points, tier-mix bars). The three tiers keep
the color of their "kept" label, so a tier looks the same in the tokens and in the plots:

    tier A  draft  bluish green  "accepted draft"
    tier B  slim   sky blue      "slim verifier: kept"      (orange when it regenerated the token)
    tier C  full   blue          "full model: kept"         (vermillion when it corrected the token)
"""

from __future__ import annotations

import html

# Okabe & Ito (2008), "Color Universal Design"; grey is the usual ninth, neutral color.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "grey": "#999999",
}

# Labels in plain words (the legend a classroom reads).
ACCEPTED_DRAFT = "accepted draft"
SLIM_KEPT = "slim verifier: kept"
SLIM_REGENERATED = "slim verifier: regenerated"
FULL_KEPT = "full model: kept"
FULL_CORRECTED = "full model: corrected"
BONUS = "bonus"
AUTOREGRESSIVE = "full model (autoregressive)"
DISCARDED = "discarded (after a replacement)"

TIER_COLORS = {
    ACCEPTED_DRAFT: OKABE_ITO["bluish_green"],
    SLIM_KEPT: OKABE_ITO["sky_blue"],
    SLIM_REGENERATED: OKABE_ITO["orange"],
    FULL_KEPT: OKABE_ITO["blue"],
    FULL_CORRECTED: OKABE_ITO["vermillion"],
    BONUS: OKABE_ITO["reddish_purple"],
    AUTOREGRESSIVE: OKABE_ITO["grey"],
}
"""Label -> color of every token label; usable as `gr.HighlightedText(color_map=TIER_COLORS)`."""

CANDIDATE_COLORS = {**TIER_COLORS, DISCARDED: OKABE_ITO["grey"]}
"""Label -> color for plotted draft candidates (tokens' labels plus the discarded ones)."""

COLOR_BY_TIER = {
    "draft": TIER_COLORS[ACCEPTED_DRAFT],
    "slim": TIER_COLORS[SLIM_KEPT],
    "full": TIER_COLORS[FULL_KEPT],
}
"""Tier -> color (the tier's "kept" color): threshold bands, latency phases."""

TIER_NAMES = {
    "draft": "tier A: accepted draft",
    "slim": "tier B: slim verifier",
    "full": "tier C: full model",
}

PHASE_COLORS = {
    "draft": COLOR_BY_TIER["draft"],
    "slim": COLOR_BY_TIER["slim"],
    "full": COLOR_BY_TIER["full"],
    "other": OKABE_ITO["grey"],
}
PHASE_NAMES = {"draft": "drafter", "slim": "slim verifier", "full": "full model", "other": "other (bookkeeping)"}

METHOD_NAMES = {"ar": "AR", "sd": "SD", "via": "VIA-SD", "hf": "HF assisted"}
METHOD_COLORS = {
    "ar": OKABE_ITO["grey"],
    "sd": OKABE_ITO["blue"],
    "via": OKABE_ITO["reddish_purple"],
    "hf": OKABE_ITO["orange"],
}
SIGNAL_COLORS = {"slim": OKABE_ITO["sky_blue"], "draft": OKABE_ITO["bluish_green"]}

LABELS_BY_METHOD = {
    "via": [ACCEPTED_DRAFT, SLIM_KEPT, SLIM_REGENERATED, FULL_KEPT, FULL_CORRECTED, BONUS],
    "sd": [FULL_KEPT, FULL_CORRECTED, BONUS],
    "ar": [AUTOREGRESSIVE],
}


def method_name(method: str) -> str:
    """The display name; an unknown method's own text, escaped (it may come from an uploaded trace)."""
    return METHOD_NAMES.get(method) or html.escape(str(method))


def _linear(channel: int) -> float:
    c = channel / 255.0
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def luminance(color: str) -> float:
    """WCAG relative luminance of a #RRGGBB color."""
    h = color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * _linear(r) + 0.7152 * _linear(g) + 0.0722 * _linear(b)


def contrast(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_color(background: str) -> str:
    """Black or white, whichever reads better on `background` (the higher WCAG contrast)."""
    return "#000000" if contrast(background, "#000000") >= contrast(background, "#FFFFFF") else "#FFFFFF"


# ---- figure theme --------------------------------------------------------------------------------

THEMES = {"light": "plotly_white", "dark": "plotly_dark"}
FONT_SIZE = 17  # big enough for a projector


def template_for(theme: str) -> str:
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {tuple(THEMES)}, got {theme!r}")
    return THEMES[theme]


def band_opacity(theme: str) -> float:
    return 0.22 if theme == "dark" else 0.13


def neutral_color(theme: str) -> str:
    """Lines and notes that must read on the theme's background."""
    return "#DDDDDD" if theme == "dark" else "#333333"
