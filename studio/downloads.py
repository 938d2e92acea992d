"""Download files: one temp folder per process (removed at exit), one sub-folder per session."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from .sessions import SESSIONS, Sessions


class Downloads:
    """Owns the process's temp folder for downloads; its lock guards making it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._root: Path | None = None

    def folder(self, request=None) -> Path:
        """This session's folder; a refresh overwrites the session's files instead of making a new folder."""
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="via-sd-"))
                atexit.register(shutil.rmtree, self._root, ignore_errors=True)
            folder = self._root / self._name(request)
            folder.mkdir(exist_ok=True)
        return folder

    @staticmethod
    def _name(request) -> str:
        # the session hash comes from the client: hashed, it can never name another path
        return hashlib.sha256(Sessions.key(request).encode()).hexdigest()[:20]

    def forget(self, request=None) -> None:
        with self._lock:
            if self._root is not None:
                shutil.rmtree(self._root / self._name(request), ignore_errors=True)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file, so a download running meanwhile never reads half a file."""
    part = path.with_name(f".{path.name}.{threading.get_ident()}")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


DOWNLOADS = Downloads()


def forget_session(request=None) -> None:
    """A visitor left the page (`demo.unload`): drop their tickets and their download files."""
    SESSIONS.forget(request)
    DOWNLOADS.forget(request)
