"""The codes cache: one safetensors file of GGUF codes / scales / offsets (and float tensors) per model.

`write_cache` turns a GGUF file into <folder>/weights.safetensors + config.json in transformers'
parameter names (4-bit codes two to a byte); `Entries` reads a cache folder (or a GGUF held in memory)
back, tensor by tensor, whole or memory-mapped, and `ExactRows` de-quantizes single rows of one tensor
(the verifier head's re-scoring). The GGUF block formats are gguf_codes.py; building a model from the
codes in a weights setting is lowbit_build.py (both re-exported here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .gguf_codes import (DECOMPOSE, FLOAT_TYPES, SUPPORTED, Codes, UnsupportedTensorType, decompose,  # noqa: F401
                         dequantize_codes, gguf_tensors)
from .gguf_file import GgufFile
from .linears import pack_nibbles, unpack_nibbles
from .build import build_model  # noqa: F401

WEIGHTS_FILE = "weights.safetensors"
_NAMES: dict = {}  # (architecture, config) -> transformers' tensor name map (_hf_names)
PLAIN = ("llama", "qwen2", "qwen3")  # architectures whose GGUF config transformers builds by renaming keys alone


def _hf_names(config, gguf, path) -> tuple[dict[str, str], object]:
    """gguf tensor name -> HF parameter name (via transformers' own map), and its tensor processor. The map takes 4-6 s
    (transformers builds gguf's name table once per module), so a process makes it once per architecture and config:
    the unpacking and its check both need it."""
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
        with init_empty_weights():
            meta = AutoModelForCausalLM.from_config(config)
        while len(_NAMES) >= 4:
            _NAMES.pop(next(iter(_NAMES)))
        _NAMES[key] = get_gguf_hf_weights_map(meta, processor_class(config=config.to_dict()))
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


def gguf_entries(path, config, gguf: GgufFile | None = None):
    """Yields (hf_name, Codes | float ndarray) of a GGUF file in transformers' parameter names."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    gguf = gguf or GgufFile(path)
    names, processor = _hf_names(config, gguf, path)
    for name, value in gguf_tensors(gguf, path):
        hf = names.get(name)
        if hf is None:
            continue  # e.g. rope_freqs: derived from the config by transformers too
        if processor is LlamaTensorProcessor:
            rows = _llama_rows(name, value.shape[0], config)
            if rows is not None:
                value = value[rows] if isinstance(value, np.ndarray) else Codes(
                    value.codes[rows], value.scale[rows], None if value.offset is None else value.offset[rows],
                    value.zero, value.bits, value.group, value.type)
        yield hf, value


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


def write_cache(path, out) -> dict:
    """GGUF file -> <out>/weights.safetensors + config.json: codes, scales and offsets as stored,
    4-bit codes two to a byte. Returns {tensor type: count}."""
    from safetensors.torch import save_file

    gguf = GgufFile(path)
    config = gguf_config(path, gguf)
    tensors, meta, counts = {}, {}, {}
    for hf, value in gguf_entries(path, config, gguf):
        if isinstance(value, Codes):
            codes = value.codes
            if value.bits == 4:
                codes = pack_nibbles(codes)
            tensors[f"{hf}.codes"] = torch.from_numpy(np.ascontiguousarray(codes))
            tensors[f"{hf}.scale"] = torch.from_numpy(value.scale)
            if value.offset is not None:
                tensors[f"{hf}.offset"] = torch.from_numpy(value.offset)
            meta[hf] = {"type": value.type, "bits": value.bits, "group": value.group, "zero": value.zero,
                        "shape": list(value.shape)}
            counts[value.type] = counts.get(value.type, 0) + 1
        else:
            tensors[hf] = torch.from_numpy(np.array(value))
            counts[str(value.dtype)] = counts.get(str(value.dtype), 0) + 1
    Path(out).mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(Path(out) / WEIGHTS_FILE), metadata={"via_sd": json.dumps(meta)})
    config.save_pretrained(str(out))
    return counts


class _CacheFile:
    """A safetensors file opened anew for every tensor: a long-lived memory map would keep every page
    read so far resident (counted in the process's RSS) until the whole model is built."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = str(path)
        with safe_open(self.path, "pt") as f:
            self._keys, self.meta = set(f.keys()), json.loads(f.metadata()["via_sd"])

    def keys(self) -> set[str]:
        return self._keys

    def get_tensor(self, key: str):
        from safetensors import safe_open

        with safe_open(self.path, "pt") as f:
            return f.get_tensor(key)

    def mapped(self, key: str) -> torch.Tensor:
        """A tensor that is a view of a private memory map of the file: a page is read only when a row
        on it is used, and counts in the RSS only then."""
        import mmap

        with open(self.path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            entry = json.loads(f.read(size))[key]
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        dtype = {"U8": torch.uint8, "I8": torch.int8, "F16": torch.float16, "BF16": torch.bfloat16,
                 "F32": torch.float32}[entry["dtype"]]
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(buffer, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=8 + size + begin)
        return flat.view(entry["shape"])


class Entries:
    """Read side of a cache file (or of a GGUF file held in memory): torch tensors by HF name."""

    def __init__(self, tensors, meta: dict | None):
        self.tensors, self.meta = tensors, tensors.meta if meta is None else meta

    @classmethod
    def from_cache(cls, folder):
        return cls(_CacheFile(Path(folder) / WEIGHTS_FILE), None)

    @classmethod
    def from_gguf(cls, path, config, gguf: GgufFile | None = None):
        tensors, meta = {}, {}
        for hf, value in gguf_entries(path, config, gguf):
            if isinstance(value, Codes):
                tensors[f"{hf}.codes"] = torch.from_numpy(value.codes)
                tensors[f"{hf}.scale"] = torch.from_numpy(value.scale)
                if value.offset is not None:
                    tensors[f"{hf}.offset"] = torch.from_numpy(value.offset)
                meta[hf] = {"type": value.type, "bits": value.bits, "group": value.group, "zero": value.zero,
                            "shape": list(value.shape), "unpacked": True}
            else:
                tensors[hf] = torch.from_numpy(np.array(value))
        return cls(tensors, meta)

    def _get(self, key):
        return self.tensors.get_tensor(key) if hasattr(self.tensors, "get_tensor") else self.tensors[key]

    def keys(self) -> set[str]:
        return set(self.meta) | {k for k in self.tensors.keys() if not k.rsplit(".", 1)[-1] in ("codes", "scale", "offset")
                                 or k.rsplit(".", 1)[0] not in self.meta}

    def is_codes(self, name: str) -> bool:
        return name in self.meta

    def float(self, name: str):
        return self._get(name).float()

    def codes(self, name: str, unpack: bool = True, mapped: bool = False):
        """(codes uint8 [N, K], scale, offset or None, info dict); with unpack=False, 4-bit codes stay
        two to a byte when the file holds them so (info["packed"] then says so); with mapped=True, a
        cache file's tensors are views of a memory map (read only where used)."""
        get = self.tensors.mapped if mapped and hasattr(self.tensors, "mapped") else self._get
        info = dict(self.meta[name])
        codes = get(f"{name}.codes")
        info["packed"] = info["bits"] == 4 and not info.get("unpacked") and not unpack
        if info["bits"] == 4 and not info.get("unpacked") and unpack:
            codes = unpack_nibbles(codes)
        offset = get(f"{name}.offset") if f"{name}.offset" in self.tensors.keys() else None
        return codes, get(f"{name}.scale"), offset, info

    def dequantize(self, name: str, rows: slice = slice(None)):
        """float32 [rows, K] of a codes tensor, as the gguf reference de-quantizer computes it."""
        return dequantize_codes(*self.codes(name), rows)

    def exact_rows(self, name: str) -> "ExactRows":
        """Rows of a codes tensor de-quantized on demand; from a cache file, without loading the rest."""
        return ExactRows(*self.codes(name, unpack=False, mapped=True))


class ExactRows:
    """ids [...] -> float32 [..., K]: the rows of one GGUF tensor, de-quantized exactly (the output
    head's rows for RescoredHead). Not a module: its codes are not weights a forward pass reads."""

    def __init__(self, codes, scale, offset, info: dict):
        self.codes, self.scale, self.offset, self.info = codes, scale, offset, info

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        # index_select, not codes[flat]: torch's advanced indexing of uint8 rows split 16 rows over two threads and
        # took milliseconds (BENCHMARKS.md, issue #39); the same gather
        codes = self.codes.index_select(0, flat)
        if self.info["packed"]:
            codes = unpack_nibbles(codes)
        offset = None if self.offset is None else self.offset.index_select(0, flat)
        w = dequantize_codes(codes, self.scale.index_select(0, flat), offset, self.info)
        return w.view(*ids.shape, -1).to(ids.device)
