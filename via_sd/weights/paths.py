"""Where VIA-SD keeps what it builds once: the embedded pair, measured kernel choices, searched routes."""

from __future__ import annotations

import os
from pathlib import Path

MODEL_FILE = "model.gguf"  # the GGUF in a cache folder, beside its config.json and tokenizer (embedded.py)
PERSISTENT = Path("/data")  # a Hugging Face Space's persistent storage, when the Space has it


def cache_root() -> Path:
    """$VIA_SD_CACHE, else /data/via-sd where /data is a writable folder (a Space with persistent storage: the
    unpacked pair, the kernel and the cost profile outlive a restart), else $XDG_CACHE_HOME/via-sd, else
    ~/.cache/via-sd."""
    if os.environ.get("VIA_SD_CACHE"):
        return Path(os.environ["VIA_SD_CACHE"]).expanduser()
    if PERSISTENT.is_dir() and os.access(PERSISTENT, os.W_OK | os.X_OK):
        return PERSISTENT / "via-sd"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "via-sd"
