"""A built model's streamed weights in 2 MB pages (Linux's transparent huge pages), read from its file.

torch.load(mmap=True) maps the built file in the page cache's pages: a file just written comes back mostly in 2 MB
folios, one read back after a restart mostly in 4 KB pages, and then a decode step streams its ~1 GB of weights
through a quarter of a million page translations, each turn from the drafter to the verifier finding the other's
page tables pushed out of the caches by the weights themselves. In 2 MB pages it needs a few hundred. So the tensors
every pass reads (the decoder layers', the final norm's, the head's streamed matrix; not the rows the head or the
embedding look up now and then) are read from the file with pread, from the page cache and not through the mapping,
into one anonymous private mapping asked for huge pages, and every tensor on them is pointed there (Tensor.set_, so
every module holding one sees it). The process maps none of their file pages, so they are not counted twice, and
the values, hence the bits, are the file's. Where the system has no transparent huge pages (another OS, THP off) or
a storage is not in the file, nothing moves. Measured: BENCHMARKS.md, 2026-12-05 (late morning).
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

import torch

HUGE = 2 << 20  # bytes of a huge page; a model streaming less stays in the file's pages
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

log = logging.getLogger(__name__)


def available() -> bool:
    """Does this system give a process transparent huge pages when it asks (madvise or always)?"""
    try:
        return "[never]" not in THP.read_text()
    except OSError:
        return False


def streamed(model) -> list[torch.Tensor]:
    """The tensors every pass reads: all the decoder layers' and the final norm's, and the head's streamed layer (a
    re-scored or narrowed head's; not the rows it looks up, nor the embedding's). Each once."""
    head = getattr(model, "lm_head", None)
    parts = [model.model.layers, getattr(model.model, "norm", None), getattr(head, "head", head)]
    found = {id(t): t for part in parts if part is not None for m in part.modules()
             for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values()) if isinstance(t, torch.Tensor)}
    return list(found.values())


def _file_ranges(path: Path) -> list[tuple[int, int, int]]:
    """(start, end, offset in the file) of this process's mappings of `path`."""
    target, ranges = str(path.resolve()), []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                start, end = (int(a, 16) for a in fields[0].split("-"))
                ranges.append((start, end, int(fields[2], 16)))
    return ranges


def _huge_area(nbytes: int) -> tuple[torch.Tensor, int]:
    """A new anonymous mapping of `nbytes` asked for huge pages, as a uint8 tensor (which keeps the mapping alive),
    and where in it a 2 MB-aligned start lies."""
    area = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, AttributeError):  # advice refused: 4 KB pages, the same values
        pass
    whole = torch.frombuffer(area, dtype=torch.uint8)
    return whole, -whole.data_ptr() % HUGE


def _read_into(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):  # a read may return less than asked
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise OSError(f"the file ended {len(view) - done} bytes early")
        done += got


@torch.no_grad()
def into_huge_pages(model, path: Path) -> int:
    """Moves `model`'s streamed storages mapped from its built file `path` into huge pages, side by side in one
    mapping (see the module docstring); returns the bytes moved."""
    if not available() or not hasattr(model, "model"):
        return 0
    ranges = _file_ranges(path)
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in streamed(model):
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    places, size = [], 0  # (file offset, bytes, where in the area, tensors)
    for ptr, tensors in by_storage.items():
        nbytes = tensors[0].untyped_storage().nbytes()
        at = next((offset + ptr - start for start, end, offset in ranges if start <= ptr and ptr + nbytes <= end), None)
        if at is not None:
            places.append((at, nbytes, size, tensors))
            size += -(-nbytes // 4096) * 4096  # each storage on its own 4 KB boundary
    if size < HUGE:
        return 0
    whole, pad = _huge_area(size)
    storage, view = whole.untyped_storage(), memoryview(whole.numpy())
    with open(path, "rb") as file:
        for at, nbytes, where, tensors in places:
            _read_into(file.fileno(), view[pad + where:pad + where + nbytes], at)
            for t in tensors:
                t.set_(storage, (pad + where) // t.element_size() + t.storage_offset(), t.size(), t.stride())
    view.release()
    log.info("%s: %.0f MB of streamed weights in 2 MB pages", path.name, size / 1e6)
    return size
