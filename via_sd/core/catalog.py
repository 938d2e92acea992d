"""What can be loaded, named without loading anything: the presets, the shipped slim routes, what a load says
when it cannot. No torch here: a page lists these before the engine is imported (app.py serves first)."""

from __future__ import annotations

from pathlib import Path

PRESETS = {
    "embedded": {"drafter": "embedded:drafter", "verifier": "embedded:verifier", "route": "embedded-default",
                 "about": "Qwen2.5-Coder 0.5B -> 1.5B Instruct, offline from PyPI wheels (CPU, int4 by default)"},
    "gpu": {"drafter": "Qwen/Qwen2.5-0.5B-Instruct", "verifier": "Qwen/Qwen2.5-7B-Instruct", "route": None,
            "about": "Qwen2.5 0.5B -> 7B Instruct from the hub, for a 24 GB+ GPU (bf16)"},
    "cpu": {"drafter": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "verifier": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "route": "embedded-default", "about": "Qwen2.5-Coder 0.5B -> 1.5B Instruct from the hub, for laptops"},
    "tiny": {"drafter": "HuggingFaceTB/SmolLM2-135M-Instruct", "verifier": "HuggingFaceTB/SmolLM2-360M-Instruct",
             "route": None, "about": "SmolLM2 135M -> 360M Instruct from the hub, for quick looks"},
    "random": {"drafter": "random:drafter", "verifier": "random:verifier", "route": "none",
               "about": "tiny random-weight Llama pair built in memory (mechanics only, gibberish text)"},
}
# What every face says of a pair loaded without a route (load_pair's warning, the CLI, the app's model line).
NO_ROUTE = "no slim route yet: the slim verifier is the full model"
ROUTES_DIR = Path(__file__).resolve().parents[2] / "assets" / "routes"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to change."""


class NoRouteWarning(UserWarning):
    """A pair was loaded without a slim route: tier B runs the full model and saves nothing."""


def shipped_routes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(ROUTES_DIR.glob("*.json"))}
