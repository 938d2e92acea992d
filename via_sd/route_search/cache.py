"""Saved routes and calibration texts: which verifier they belong to, and where searched ones are cached."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.routing import ROUTES_DIR

BASELINE_DIR = ROUTES_DIR / "baseline"


def model_identity(pair) -> dict:
    """Which verifier a route or calibration file belongs to."""
    cfg = pair.verifier.config
    return {"verifier": pair.verifier_name, "architecture": type(pair.verifier).__name__,
            "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "parameters": sum(p.numel() for p in pair.verifier.parameters())}


def same_model(saved: dict | None, identity: dict) -> bool:
    keys = ("verifier", "num_layers", "hidden_size")
    return isinstance(saved, dict) and all(saved.get(k) == identity[k] for k in keys)


def route_cache_dir() -> Path:
    """Where routes searched for models without a shipped one are kept: $VIA_SD_CACHE/routes or
    ~/.cache/via-sd/routes."""
    from ..weights.paths import cache_root

    return cache_root() / "routes"


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def saved_routes(identity: dict | None = None) -> list[tuple[Path, dict]]:
    """(path, data) of shipped, baseline and cached route files, those of one model if `identity` is given."""
    found = []
    for folder in (ROUTES_DIR, BASELINE_DIR, route_cache_dir()):
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "skip" in data and (identity is None
                                                              or same_model(data.get("model"), identity)):
                found.append((path, data))
    return found
