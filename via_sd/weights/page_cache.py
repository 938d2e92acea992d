"""A built model's file in the page cache in 2 MB folios, so that its mapping is PMD-mapped: 2 MB pages.

A decode step streams every weight once; over 4 KB pages the CPU walks the page table every 4 KB and its prefetchers
stop at each page's end. Whether a mapped file gets 2 MB pages is decided when its pages enter the page cache: a
file just written, or read ahead whole (posix_fadvise WILLNEED), comes mostly in 2 MB folios; one read back page by
page (after the kernel evicted it under pressure, or read in small pieces) stays in 4 KB folios for as long as it
is cached, and every later mapping of it gets 4 KB pages. Measured on the embedded pair: BENCHMARKS.md.

`read_in_large_pages` reads the file through a mapping that asks for 2 MB pages (MADV_HUGEPAGE, so its faults read
2 MB folios; MADV_POPULATE_READ faults it in), then counts what the mapping got (its FilePmdMapped in
/proc/self/smaps). Where the cache held the file in small folios, those are dropped (POSIX_FADV_DONTNEED: pages
another process maps stay) and read again, once: where that read too leaves it small (transparent huge pages off, a
filesystem without large folios), a note beside the file (`<file>.small-pages`) says so, and later loads keep the
cache as it is rather than read the file again at every start. Elsewhere than Linux, or where the kernel lacks
these advices, the file is only read ahead.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

log = logging.getLogger(__name__)

LARGE = 2 << 20
MADV_POPULATE_READ = 22  # Linux 5.14; Python's mmap module names it from 3.13 on
HELD_LARGE = 0.9  # below this share of the file PMD-mapped, the cache holds it in small folios
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def read_in_large_pages(path: Path) -> None:
    """Reads `path` into the page cache now, in 2 MB folios where the OS has them, re-reading a file cached small."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        share = _populate(fd, size)
        if share is None:
            _read_ahead(fd)
        elif share < HELD_LARGE and _may_read_again(path):
            os.fdatasync(fd)  # a file just written: its dirty pages are not dropped until they are on disk
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            again = _populate(fd, size) or 0.0
            log.info("%s was cached in small pages (%.0f%% in 2 MB pages): read again, %.0f%%", path.name,
                     100 * share, 100 * again)
            if again < HELD_LARGE:
                _note(path).touch()
    except OSError as err:  # a read-only cache (no note), a file gone meanwhile: the load goes on as it is
        log.debug("page cache advice for %s: %s", path, err)
    finally:
        os.close(fd)


def forget(path: Path) -> None:
    """Removes the note `read_in_large_pages` may have left beside `path` (the file itself is going)."""
    _note(path).unlink(missing_ok=True)


def _note(path: Path) -> Path:
    return path.with_name(path.name + ".small-pages")


def _may_read_again(path: Path) -> bool:
    """Could reading the file again give it 2 MB pages: transparent huge pages not off, and no earlier read again of
    this file left it small."""
    try:
        thp = THP_SETTING.read_text()
    except OSError:
        return False
    return "[never]" not in thp and not _note(path).exists()


def _populate(fd: int, size: int) -> float | None:
    """Faults the whole file in through a mapping that asks for 2 MB pages; the share of it that got them, or None
    where this OS cannot say."""
    if size < LARGE or not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"):
        return None
    view = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        view.madvise(mmap.MADV_HUGEPAGE)
        view.madvise(MADV_POPULATE_READ)
        return _pmd_mapped(_address(view)) / size
    except OSError:  # a kernel before 5.14, or one without transparent huge pages
        return None
    finally:
        view.close()


def _address(view: mmap.mmap) -> int:
    import numpy as np

    first = np.frombuffer(view, np.uint8, count=1)
    try:
        return first.ctypes.data
    finally:
        del first  # the mapping closes only once no buffer holds it


def _pmd_mapped(start: int) -> int:
    """Bytes of the mapping at `start` mapped in 2 MB pages, from /proc/self/smaps."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            if "-" in line.split(" ", 1)[0] and line[0] in "0123456789abcdef":
                inside = int(line.split("-", 1)[0], 16) == start
            elif inside and line.startswith("FilePmdMapped:"):
                return int(line.split()[1]) * 1024
    return 0


def _read_ahead(fd: int) -> None:
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):  # no posix_fadvise (macOS, Windows): pages are read as they are touched
        pass
