"""Where VIA-SD keeps what it builds once: the embedded pair, measured kernel choices, searched routes."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$VIA_SD_CACHE, else $XDG_CACHE_HOME/via-sd, else ~/.cache/via-sd."""
    if os.environ.get("VIA_SD_CACHE"):
        return Path(os.environ["VIA_SD_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "via-sd"
