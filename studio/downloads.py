"""Download files: one temp folder per process (removed at exit, SIGTERM included: `app.launch`), one
sub-folder per session, removed with Gradio's copies of its files when the session ends."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

import gradio as gr
from gradio import processing_utils
from gradio import utils as gradio_utils

from .memory import release_state
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
                atexit.register(self.remove_all)
            folder = self._root / self._name(request)
            folder.mkdir(exist_ok=True)
        return folder

    @staticmethod
    def _name(request) -> str:
        # the session hash comes from the client: hashed, it can never name another path
        return hashlib.sha256(Sessions.key(request).encode()).hexdigest()[:20]

    def forget(self, request=None, gradio_cache: str | None = None) -> None:
        """Remove this session's folder and the copies Gradio served of its files (in Gradio's cache, named by
        their contents' hash)."""
        with self._lock:
            if self._root is not None:
                self._remove(self._root / self._name(request), gradio_cache)

    def remove_all(self) -> None:
        """The process ends (at exit, SIGTERM included: `app.launch`): every session's files go, Gradio's copies
        too."""
        with self._lock:
            if self._root is not None and self._root.exists():
                for folder in self._root.iterdir():
                    self._remove(folder, None)
                shutil.rmtree(self._root, ignore_errors=True)

    @staticmethod
    def _remove(folder: Path, gradio_cache: str | None) -> None:
        cache = Path(gradio_cache or gradio_utils.get_upload_folder())
        for path in folder.glob("*"):
            with contextlib.suppress(OSError):
                copy = cache / processing_utils.hash_file(path) / path.name
                copy.unlink(missing_ok=True)
                copy.parent.rmdir()  # only when empty
        shutil.rmtree(folder, ignore_errors=True)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file, so a download running meanwhile never reads half a file."""
    part = path.with_name(f".{path.name}.{threading.get_ident()}")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


DOWNLOADS = Downloads()


def forget_session(request: gr.Request = None) -> None:
    """A visitor left the page (`demo.unload`; a `gradio_client` session's end too): drop their tickets, their
    download files and Gradio's copies of them, and their state."""
    SESSIONS.forget(request)
    server = getattr(getattr(request, "request", None), "app", None)  # Gradio's app, for a queued or heartbeat call
    blocks = server.get_blocks() if hasattr(server, "get_blocks") else None
    DOWNLOADS.forget(request, getattr(blocks, "GRADIO_CACHE", None))
    release_state(server, request)
