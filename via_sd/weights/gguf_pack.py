"""A GGUF file's tensors in transformers' parameter names, read from the file one tensor (or row chunk) at a time.

`Entries` maps transformers' names to the GGUF's tensors (transformers' own name map) and hands out, per tensor
or chunk of rows: the raw blocks (build.py rearranges Q4_K and Q6_K blocks straight into the kernel's tiles),
codes with per-group scales and offsets (gguf_codes.py: exact), de-quantized floats, or `ExactRows` (single rows
of one tensor de-quantized on demand: the verifier head's re-scoring). Nothing holds the whole model in memory:
each read copies only its rows out of the file. `gguf_config` and `gguf_tokenizer` read the rest of a GGUF.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from . import lowbit_kernel
from .gguf_codes import DECOMPOSE, FLOAT_TYPES, SUPPORTED, Codes, UnsupportedTensorType, decompose  # noqa: F401
from .gguf_file import GgufFile, TensorEntry
from .paths import MODEL_FILE
from .build import build_model  # noqa: F401

_NAMES: dict = {}  # (architecture, config) -> transformers' tensor name map (_hf_names)
PLAIN = ("llama", "qwen2", "qwen3")  # architectures whose GGUF config transformers builds by renaming keys alone


def _hf_names(config, gguf, path) -> tuple[dict[str, str], object]:
    """gguf tensor name -> HF parameter name (via transformers' own map), and its tensor processor. The map takes ~2 s,
    so a process makes it once per architecture and config: the first start's check and build both need it."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor, TensorProcessor,
                                                         get_gguf_hf_weights_map)

    processor_class = TENSOR_PROCESSORS.get(gguf.architecture, TensorProcessor)
    if processor_class not in (TensorProcessor, LlamaTensorProcessor):
        raise UnsupportedTensorType(f"{path}: GGUF architecture {gguf.architecture!r} needs transformers' own tensor "
                                    "processing; load it with weights='fp32' or 'bf16'")
    key = (gguf.architecture, json.dumps({k: v for k, v in config.to_dict().items()  # where it was read from aside
                                          if k not in ("_name_or_path", "architectures", "transformers_version")},
                                         sort_keys=True, default=str))
    if key not in _NAMES:
        import gguf as package

        with init_empty_weights():
            meta = AutoModelForCausalLM.from_config(config)
        while len(_NAMES) >= 4:
            _NAMES.pop(next(iter(_NAMES)))
        # transformers walks every sub-module and asks gguf for the whole name table at each (about 300 times for a
        # 28-layer model: 5.2 s of 5.6); the table depends only on the architecture and depth, so it is made once
        original = package.get_tensor_name_map
        package.get_tensor_name_map = lru_cache(maxsize=None)(original)
        try:
            _NAMES[key] = get_gguf_hf_weights_map(meta, processor_class(config=config.to_dict()))
        finally:
            package.get_tensor_name_map = original
    return _NAMES[key], processor_class


def _llama_rows(name: str, rows: int, config) -> np.ndarray | None:
    """llama.cpp permutes the rows of Llama's q / k weights for its rotary layout; the row order
    transformers undoes it with (codes, scales and offsets move with their rows)."""
    heads = config.num_attention_heads
    if ".attn_q." in name:
        n = heads
    elif ".attn_k." in name:
        n = config.num_key_value_heads or heads
    else:
        return None
    index = np.arange(rows)
    return index.reshape(n, rows // n // 2, 2).swapaxes(2, 1).reshape(rows)


def gguf_config(path, gguf: GgufFile | None = None):
    """The transformers config of a GGUF file; the head is tied only when the file has no output.weight.

    Where transformers' GGUF loader only renames keys (llama, qwen2, qwen3 and the like: `PLAIN`), the config comes
    from the header read once (gguf_file.py) through transformers' own key map and defaults; every other
    architecture goes through `AutoConfig.from_pretrained`, which reads the file again with gguf's reader."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path, gguf = Path(path), gguf or GgufFile(path)
    arch, meta = gguf.architecture, gguf.metadata
    if arch in PLAIN and not (arch == "llama" and "mistral" in str(meta.get("general.name", "")).lower()):
        values = {**GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}), "tie_word_embeddings": "output.weight" not in gguf.tensor_names()}
        for key, value in meta.items():
            prefix, _, rest = key.partition(".")
            name = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
            if name not in (None, -1):
                values[name] = value
        values.setdefault("vocab_size", meta.get("tokenizer.ggml.tokens"))  # a string array: its length
        config = CONFIG_MAPPING[values["model_type"]].from_dict(values)
    else:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = "output.weight" not in gguf.tensor_names()
    return config


def gguf_tokenizer(path, config=None):
    """The tokenizer a GGUF file describes, as `AutoTokenizer.from_pretrained(folder, gguf_file=...)` builds it, without
    the second read of the whole header that AutoTokenizer makes to find the class (13 s of 14 s on a Qwen file)."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    path = Path(path)
    config = config or gguf_config(path)
    found = TOKENIZER_MAPPING.get(type(config), None)
    found = next((c for c in reversed(found) if c is not None), None) if isinstance(found, tuple) else found
    loader = found or AutoTokenizer
    return loader.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)


class Entries:
    """The tensors of one GGUF file by transformers' parameter names, each read from the file when asked for."""

    def __init__(self, path, tensors: dict[str, TensorEntry], order: dict[str, np.ndarray]):
        self.path, self.tensors, self.order = str(path), tensors, order  # order: llama's q / k row order

    @classmethod
    def from_gguf(cls, path, config, gguf: GgufFile | None = None) -> "Entries":
        from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

        gguf = gguf or GgufFile(path)
        names, processor = _hf_names(config, gguf, path)
        tensors, order = {}, {}
        for t in gguf.tensors:
            hf = names.get(t.name)
            if hf is None:
                continue  # e.g. rope_freqs: derived from the config by transformers too
            if t.type not in FLOAT_TYPES and (t.type not in DECOMPOSE or len(t.shape) != 2):
                shape = "" if len(t.shape) == 2 else f" with shape {t.shape} (quantized tensors must be 2-D)"
                raise UnsupportedTensorType(f"GGUF tensor type {t.type}{shape} is not supported (tensor {t.name} in "
                                            f"{path}); supported: {', '.join(SUPPORTED)}")
            tensors[hf] = t
            rows = _llama_rows(t.name, t.shape[0], config) if processor is LlamaTensorProcessor else None
            if rows is not None:
                order[hf] = rows
        return cls(path, tensors, order)

    @classmethod
    def from_folder(cls, folder, config) -> "Entries":
        """A cache folder's GGUF (embedded.py keeps it as model.gguf beside config.json)."""
        return cls.from_gguf(Path(folder) / MODEL_FILE, config)

    def keys(self) -> set[str]:
        return set(self.tensors)

    def is_codes(self, name: str) -> bool:
        return self.tensors[name].type not in FLOAT_TYPES

    def type(self, name: str) -> str:
        return self.tensors[name].type

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def raw(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """The stored bytes of `rows` (uint8 [rows, bytes a row]), copied out of the file (a long-lived map would
        keep every page read so far in the process's memory until the whole model is built)."""
        t = self.tensors[name]
        n = t.shape[0]
        width = t.data.nbytes // n
        if name in self.order:  # llama's q / k: rows the file keeps in another order
            index = self.order[name][rows]
            return np.fromfile(self.path, np.uint8, n * width, offset=t.offset).reshape(n, width)[index]
        start, stop, _ = rows.indices(n)
        return np.fromfile(self.path, np.uint8, (stop - start) * width, offset=t.offset + start * width
                           ).reshape(-1, width)

    def codes(self, name: str, rows: slice = slice(None)) -> Codes:
        """Codes, scales and offsets of `rows` (gguf_codes.decompose)."""
        raw = self.raw(name, rows)
        width = self.tensors[name].shape[1]
        return decompose(raw, self.type(name), (raw.shape[0], width), where=f" (tensor {name} in {self.path})")

    def chunks(self, name: str, rows: int):
        """The row slices of a tensor, `rows` at a time."""
        n = self.tensors[name].shape[0]
        return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]

    def float(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        """float32 values of `rows`: a float tensor as stored, a quantized one de-quantized."""
        kind = self.type(name)
        if kind not in FLOAT_TYPES:
            return self.dequantize(name, rows)
        data = self.raw(name, rows).view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[kind])
        if kind == "BF16":
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return torch.from_numpy(data.astype(np.float32)).reshape(-1, *self.shape(name)[1:])

    def dequantize(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        """float32 [rows, K] of a quantized tensor, as the gguf reference de-quantizer computes it."""
        return torch.from_numpy(self.codes(name, rows).dequantize())

    def exact_rows(self, name: str) -> "ExactRows":
        """Rows of a quantized tensor de-quantized on demand, its blocks mapped from the file (read where used)."""
        t = self.tensors[name]
        n = t.shape[0]
        blocks = np.memmap(self.path, np.uint8, mode="c", offset=t.offset, shape=(n, t.data.nbytes // n))
        if name in self.order:
            blocks = blocks[self.order[name]]
        return ExactRows(torch.from_numpy(blocks), t.type, t.shape[1])


class ExactRows:
    """ids [...] -> float32 [..., K]: the rows of one GGUF tensor, de-quantized exactly (the output head's rows for
    RescoredHead), from its blocks [rows, bytes a row]. Not a module: its blocks are not weights a forward pass
    reads."""

    def __init__(self, blocks: torch.Tensor, kind: str, width: int):
        self.blocks, self.kind, self.width = blocks, kind, width

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        if self.kind == "Q6_K" and lowbit_kernel.available():  # a verifier step's head: one call, the same bits
            w = lowbit_kernel.module().q6k_rows(self.blocks, flat, self.width)  # (head_rows.cpp)
        else:
            # index_select, not blocks[flat]: torch's advanced indexing of uint8 rows split 16 rows over two threads
            # and took milliseconds (BENCHMARKS.md, issue #39)
            raw = self.blocks.index_select(0, flat).numpy()
            w = torch.from_numpy(decompose(raw, self.kind, (len(flat), self.width)).dequantize())
        return w.view(*ids.shape, -1).to(ids.device)
