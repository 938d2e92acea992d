"""A built model's file is read into the page cache in 2 MB folios, whatever folios the cache held it in before."""

import mmap
import os
import sys
from pathlib import Path

import pytest

from via_sd.weights import page_cache
from via_sd.weights.page_cache import HELD_LARGE, read_in_large_pages

THP = page_cache.THP_SETTING
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists() or "[never]" in
                                THP.read_text(), reason="2 MB pages of a file: Linux with transparent huge pages")


def cache_in_small_pages(path: Path) -> None:
    """The file's pages dropped, then read back 4 KB at a time with read-ahead off: each in its own folio."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for offset in range(0, os.fstat(fd).st_size, 4096):
            os.pread(fd, 4096, offset)
    finally:
        os.close(fd)


def share_in_2mb_pages(path: Path) -> float:
    """What a mapping of the file as the cache holds it gets in 2 MB pages (no advice that would read it again)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as view:
        view.madvise(page_cache.MADV_POPULATE_READ)
        return page_cache._pmd_mapped(page_cache._address(view)) / os.path.getsize(path)


def test_a_file_cached_in_small_pages_is_read_again_in_2mb_pages(tmp_path):
    path = tmp_path / "weights.bin"
    data = os.urandom(16 << 20)
    with open(path, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())  # dirty pages would stay cached as written
    cache_in_small_pages(path)
    assert share_in_2mb_pages(path) == 0, "the file starts cached in 4 KB pages"
    read_in_large_pages(path)
    assert share_in_2mb_pages(path) >= HELD_LARGE
    assert path.read_bytes() == data
    read_in_large_pages(path)  # held large: read once more, kept as it is
    assert share_in_2mb_pages(path) >= HELD_LARGE


def test_a_small_or_missing_file_is_only_read_ahead(tmp_path):
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 4096)
    read_in_large_pages(small)
    read_in_large_pages(tmp_path / "missing.bin")
    assert small.read_bytes() == b"x" * 4096


def test_a_file_the_kernel_keeps_small_is_read_again_once_not_at_every_load(tmp_path, monkeypatch):
    """Where a second read leaves the file small too (huge pages off, a filesystem without large folios), a note
    beside it stops later loads from dropping a warm cache and reading the file again at every start."""
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(4 << 20))
    monkeypatch.setattr(page_cache, "_populate", lambda fd, size: 0.0)  # what such a kernel reports
    drops = []
    advise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, o, n, how: (drops.append(how), advise(fd, o, n, how)))
    for _ in range(3):
        read_in_large_pages(path)
    assert drops.count(os.POSIX_FADV_DONTNEED) == 1
    assert (tmp_path / "weights.bin.small-pages").exists()
    page_cache.forget(path)
    assert not (tmp_path / "weights.bin.small-pages").exists()
