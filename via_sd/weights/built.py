"""The int4 models as built, kept once per cache: a later start opens them instead of building them again.

Building a model of the embedded pair from its GGUF (build.build_model: every tensor re-packed into the
kernel's tiles, the drafter's head rows selected, q/k/v and gate/up fused) is the same work at every start. The
first start builds both models at once, each in a child process (`build_apart`: a clean process builds faster than
one serving the page), which saves what it built (torch.save of the module tree: exactly the tensors the built
layers hold, and the modules that hold them); the load, and every later start, opens that file memory-mapped
(torch.load(mmap=True)): nothing is converted, and the file is read into the page cache first, whole and in 2 MB
pages where the OS has them (page_cache.py), rather than page by page as the first passes touch it.

A file is keyed by everything that decides its bytes: the GGUF's sha256 (READY.json of the cache folder), the
weights layer's sources (via_sd/weights/*.py and *.cpp: a kernel whose layout changes is another key), the layout
in use (the project's kernel or torch's, and torch's block of rows), the drafter's frequency list, torch's and
transformers' versions, the weights setting and the build's options. A folder keeps the file just written and the
newest of other keys (two checkouts of other sources sharing a cache); older ones go. A file that does not open is built again (and replaced), never trusted.

The file is a pickle written by this cache into it; like the compiled kernel next to it, whoever can write the
cache can run code in the app.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .page_cache import forget, read_in_large_pages
from .paths import cache_root

log = logging.getLogger(__name__)
FORMAT = 1  # bump when what this module writes changes shape
KEEP = 2    # built files kept per model folder: this key's and the newest other (two checkouts sharing a cache)
SOURCES = Path(__file__).resolve().parent
TOKEN_FREQ = SOURCES.parents[1] / "assets" / "token_freq"


@lru_cache(maxsize=1)
def sources_digest() -> str:
    """sha256 of the weights layer's sources (every .py and .cpp under via_sd/weights/) and the token lists."""
    digest = hashlib.sha256()
    files = sorted([*SOURCES.glob("*.py"), *SOURCES.glob("*.cpp"), *TOKEN_FREQ.glob("*.json")])
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _layout() -> str:
    """The layout new low-bit layers take here: the project's kernel's tiles, or torch's packing (and its block)."""
    from .linears import _torch_block, use_tiles

    return "tiles" if use_tiles() else f"torch block {_torch_block()}"


def built_key(folder: Path, weights: str, options: dict) -> dict | None:
    """What the built model of the cache folder `folder` depends on; None when the folder names no sha256 (only a
    verified folder is cached)."""
    try:
        ready = json.loads((Path(folder) / "READY.json").read_text())
        sha256 = ready["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    import transformers

    return {"format": FORMAT, "sha256": sha256, "sources": sources_digest(), "layout": _layout(),
            "weights": weights, "options": dict(sorted(options.items())), "torch": torch.__version__,
            "transformers": transformers.__version__}


def built_path(folder: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "built" / Path(folder).name / f"{digest}.pt"


def _detach_watchers(model: nn.Module) -> int:
    """Removes the drafter head's input watchers (heads.FrequentHead.watch: closures a pickle cannot hold) before
    saving; returns how many it removed (`_watch` puts them back)."""
    watchers = [k for k, hook in model._forward_pre_hooks.items()
                if getattr(hook, "__qualname__", "").startswith("FrequentHead.watch.")]
    for k in watchers:
        del model._forward_pre_hooks[k]
        model._forward_pre_hooks_with_kwargs.pop(k, None)
    return len(watchers)


def _watch(model: nn.Module) -> None:
    from .heads import FrequentHead

    for module in model.modules():
        if isinstance(module, FrequentHead):
            module.watch(model)


def _open(path: Path, key: dict) -> nn.Module | None:
    try:
        read_in_large_pages(path)
        model = torch.load(path, mmap=True, weights_only=False)
        if not isinstance(model, nn.Module) or getattr(model, "via_sd_built", None) != key:
            raise ValueError(f"holds a {type(model).__name__} of another key")
    except Exception as err:  # a truncated or foreign file: build again
        log.warning("the built model %s did not open (%s): building it again", path, str(err)[:200])
        return None
    _watch(model)
    return model


def _save(model: nn.Module, path: Path, key: dict) -> None:
    """Writes `model` to `path` atomically (a temporary file renamed); of this folder's files of other keys only the
    newest stays."""
    start, heads, tmp = time.perf_counter(), _detach_watchers(model), None
    model.via_sd_built = key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".tmp", dir=path.parent)
        os.close(fd)
        torch.save(model, tmp)
        os.chmod(tmp, 0o644)  # as the cache's other files (mkstemp's are the owner's alone)
        os.replace(tmp, path)
    except Exception as err:  # a full or read-only cache, a module a pickle cannot hold: the next start builds again
        log.warning("could not keep the built model at %s: %s", path, str(err)[:200])
        return
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if heads:
            _watch(model)
    log.info("kept the built model %s in %.1f s", path.parent.name, time.perf_counter() - start)
    others = sorted((p for p in path.parent.glob("*.pt") if p != path), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP - 1:]:  # the newest others stay: checkouts of other sources sharing one cache
        old.unlink(missing_ok=True)
        forget(old)


def built_model(folder, weights: str, options: dict, build: Callable[[], nn.Module]) -> nn.Module:
    """The model `build()` makes from the cache folder `folder` in `weights` with `options`: opened from the cache
    when an earlier start (or `build_apart`) kept it, else built now and kept. Only int4 is kept (fp32 / bf16 would
    copy the float model to disk, and load as fast from the GGUF as from there); a folder without READY.json is
    built always."""
    key = built_key(Path(folder), weights, options) if weights == "int4" else None
    if key is None:
        return build()
    path = built_path(Path(folder), key)
    if path.is_file() and (model := _open(path, key)) is not None:
        return model
    start = time.perf_counter()
    model = build()
    log.info("built %s in %.1f s", path.parent.name, time.perf_counter() - start)
    _save(model, path, key)
    return model


def build_folder(folder, weights: str, options: dict) -> nn.Module:
    """A cache folder's model (its GGUF, embedded.py) in `weights` with build_model's `options`."""
    from transformers import AutoConfig

    from .build import build_model
    from .gguf_pack import Entries

    config = AutoConfig.from_pretrained(str(folder))
    return build_model(config, Entries.from_folder(folder, config), weights, **options)


def to_build(jobs) -> list[tuple[Path, str, dict]]:
    """The (folder, weights, options) of `jobs` whose int4 model is kept nowhere yet (a first start)."""
    return [(Path(f), w, o) for f, w, o in jobs
            if w == "int4" and (key := built_key(Path(f), w, o)) is not None and not built_path(Path(f), key).is_file()]


def build_apart(jobs) -> None:
    """Builds and keeps each (folder, weights, options) model of `jobs` in a child process of its own, all at once, and
    returns when all have ended. Two children use both cores, and neither has the app's fixed mmap threshold
    (studio/memory.py: every block of 128 KiB or more its own mapping), under which the app built the same models
    1.5-2x slower (3.1 M page faults against 0.7 M; BENCHMARKS.md, 2026-12-04). A child that fails keeps nothing and
    says why in the log: `built_model` then builds in this process, as it always did."""
    import subprocess
    import sys

    children = []
    try:
        for folder, weights, options in jobs:
            err = tempfile.TemporaryFile()
            children.append((folder, err, subprocess.Popen(
                [sys.executable, "-m", "via_sd.weights.built", str(folder), weights, json.dumps(options)],
                cwd=SOURCES.parents[1], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)))
        for folder, err, child in children:
            if child.wait():
                err.seek(0)
                log.warning("building %s in a child process failed (exit %s): %s; building it here", Path(folder).name,
                            child.returncode, err.read().decode(errors="replace").strip()[-600:])
    finally:
        for _, err, child in children:
            if child.poll() is None:  # this process was stopped: its children go too
                child.terminate()
                child.wait()
            err.close()


def _build_and_keep(folder: str, weights: str, options: dict) -> None:
    if built_key(Path(folder), weights, options) is None:
        raise SystemExit(f"{folder} holds no verified GGUF (READY.json)")
    built_model(folder, weights, options, lambda: build_folder(folder, weights, options))


if __name__ == "__main__":  # a child of build_apart: python -m via_sd.weights.built FOLDER WEIGHTS OPTIONS_JSON
    import sys

    logging.basicConfig(level=logging.WARNING)
    _build_and_keep(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
