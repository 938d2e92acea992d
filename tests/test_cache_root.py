"""Where the cache goes: $VIA_SD_CACHE wins; a Space's persistent /data when it is writable; else the user's cache."""

from pathlib import Path

from via_sd.weights import paths


def test_a_writable_data_folder_holds_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("VIA_SD_CACHE", raising=False)
    monkeypatch.setattr(paths, "PERSISTENT", tmp_path)
    assert paths.cache_root() == tmp_path / "via-sd"


def test_via_sd_cache_wins_over_persistent_storage(monkeypatch, tmp_path):
    monkeypatch.setattr(paths, "PERSISTENT", tmp_path)
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "mine"))
    assert paths.cache_root() == tmp_path / "mine"


def test_without_persistent_storage_the_cache_stays_where_it_was(monkeypatch, tmp_path):
    monkeypatch.delenv("VIA_SD_CACHE", raising=False)
    monkeypatch.setattr(paths, "PERSISTENT", tmp_path / "no-data-mount")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "xdg" / "via-sd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.cache_root() == Path.home() / ".cache" / "via-sd"
    monkeypatch.setattr(paths.os, "access", lambda path, mode: False)  # /data there but read-only
    monkeypatch.setattr(paths, "PERSISTENT", tmp_path)
    assert paths.cache_root() == Path.home() / ".cache" / "via-sd"
