"""GGUF tensors -> integer codes with per-group scale and offset, straight from the blocks.

Every GGUF block type we take is, per group of `group` weights along a row, an affine map of small
unsigned integer codes:

    w = (codes - zero) * scale [+ offset]

    type   bits group  zero  scale          offset
    Q4_0    4    32     8    d              -
    Q4_1    4    32     0    d              m
    Q5_0    5    32    16    d              -
    Q5_1    5    32     0    d              m
    Q8_0    8    32   128    d              -
    Q4_K    4    32     0    d * sc[j]      -dmin * m[j]
    Q5_K    5    32     0    d * sc[j]      -dmin * m[j]
    Q6_K    6    16    32    d * sc[j]      -

computed in float32 in the same order as the `gguf` package's reference de-quantizer, so
`dequantize(decompose(...))` equals `gguf.quants.dequantize(...)` bit for bit. F32 / F16 / BF16
tensors stay floats. Anything else (IQ*, Q2_K, Q3_K, TQ*, MXFP4...) is an UnsupportedTensorType.
Nothing here builds the whole float model: one tensor at a time, as numpy arrays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .lowbit import pack_nibbles, unpack_nibbles


class UnsupportedTensorType(ValueError):
    """A GGUF tensor type we cannot unpack; names the type, the tensor and the file."""


@dataclass
class Codes:
    """A [rows, cols] weight as codes (uint8, one per weight) with per-group scale / offset."""

    codes: np.ndarray            # uint8 [rows, cols]
    scale: np.ndarray            # float32 [rows, cols // group]
    offset: np.ndarray | None    # float32 [rows, cols // group] or None
    zero: int
    bits: int
    group: int
    type: str

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> np.ndarray:
        rows, cols = self.codes.shape
        q = (self.codes.astype(np.int16) - self.zero).astype(np.float32).reshape(rows, -1, self.group)
        w = q * self.scale[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.reshape(rows, cols)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, runs: int, width: int) -> np.ndarray:
    """Low nibbles of each run of `width` bytes, then their high nibbles (ggml's order)."""
    n = qs.shape[0]
    q = qs.reshape(n, runs, 1, width) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, runs * 2 * width)


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    """Bit i of a little-endian uint32 per block, i = 0..31."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(b):
    d, qs = b[:, :2], b[:, 2:]
    return _nibbles(qs, 1, 16), _f16(d), None, 8, 4, 32


def _q4_1(b):
    d, m, qs = b[:, :2], b[:, 2:4], b[:, 4:]
    return _nibbles(qs, 1, 16), _f16(d), _f16(m), 0, 4, 32


def _q5_0(b):
    d, qh, qs = b[:, :2], b[:, 2:6], b[:, 6:]
    return _nibbles(qs, 1, 16) | (_high_bits32(qh) << np.uint8(4)), _f16(d), None, 16, 5, 32


def _q5_1(b):
    d, m, qh, qs = b[:, :2], b[:, 2:4], b[:, 4:8], b[:, 8:]
    return _nibbles(qs, 1, 16) | (_high_bits32(qh) << np.uint8(4)), _f16(d), _f16(m), 0, 5, 32


def _q8_0(b):
    d, x = b[:, :2], b[:, 2:]
    return (x.view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(d), None, 128, 8, 32


def _k_scales(b):
    from gguf.quants import Q4_K

    d, dmin, scales = _f16(b[:, :2]), _f16(b[:, 2:4]), b[:, 4:16]
    sc, m = Q4_K.get_scale_min(scales.copy())
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b):
    scale, offset = _k_scales(b)
    return _nibbles(b[:, 16:], 4, 32), scale, offset, 0, 4, 32


def _q5_k(b):
    scale, offset = _k_scales(b)
    n = b.shape[0]
    qh, qs = b[:, 16:48], b[:, 48:]
    high = (qh.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)
    return _nibbles(qs, 4, 32) | (high.reshape(n, 256) << np.uint8(4)), scale, offset, 0, 5, 32


def _q6_k(b):
    n = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    scale = _f16(d) * scales.copy().view(np.int8).astype(np.float32)
    low = _nibbles(ql, 2, 64)
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    return low | (high.reshape(n, 256) << np.uint8(4)), scale, None, 32, 6, 16


DECOMPOSE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *DECOMPOSE)


def decompose(data: np.ndarray, type_name: str, shape: tuple[int, int], where: str = "") -> Codes:
    """Raw blocks of a [rows, cols] tensor (uint8, [rows, bytes_per_row]) -> Codes."""
    if type_name not in DECOMPOSE:
        raise UnsupportedTensorType(f"GGUF tensor type {type_name} is not supported{where}; "
                                    f"supported: {', '.join(SUPPORTED)}")
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rows, cols = shape
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(rows * cols // block, nbytes)
    codes, scale, offset, zero, bits, group = DECOMPOSE[type_name](blocks)
    return Codes(codes.reshape(rows, cols), scale.reshape(rows, cols // group).astype(np.float32),
                 None if offset is None else offset.reshape(rows, cols // group).astype(np.float32),
                 zero, bits, group, type_name)


def gguf_tensors(reader, path: str | Path = ""):
    """Yields (gguf_name, Codes or float ndarray) for every tensor of a GGUFReader, one at a time."""
    for t in reader.tensors:
        kind = t.tensor_type.name
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # ggml lists the fastest dim first
        if kind in FLOAT_TYPES:
            data = np.asarray(t.data)
            if kind == "BF16":
                data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            yield t.name, data.reshape(shape)
        elif len(shape) == 2:
            yield t.name, decompose(t.data, kind, shape, where=f" (tensor {t.name} in {path})")
        else:
            raise UnsupportedTensorType(f"GGUF tensor {t.name} in {path}: type {kind} with shape {shape} "
                                        "is not supported (quantized tensors must be 2-D)")


# ---- the cache: one safetensors file of codes / scales / offsets (and float tensors) per model ----

WEIGHTS_FILE = "weights.safetensors"


def _architecture(reader) -> str:
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def _hf_names(config, reader, path) -> tuple[dict[str, str], object]:
    """gguf tensor name -> HF parameter name (via transformers' own map), and its tensor processor."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor, TensorProcessor,
                                                         get_gguf_hf_weights_map)

    arch = _architecture(reader)
    processor_class = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    if processor_class not in (TensorProcessor, LlamaTensorProcessor):
        raise UnsupportedTensorType(f"{path}: GGUF architecture {arch!r} needs transformers' own tensor processing; "
                                    "load it with weights='fp32' or 'bf16'")
    with init_empty_weights():
        meta = AutoModelForCausalLM.from_config(config)
    return get_gguf_hf_weights_map(meta, processor_class(config=config.to_dict())), processor_class


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


def gguf_entries(path, config, reader=None):
    """Yields (hf_name, Codes | float ndarray) of a GGUF file in transformers' parameter names."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reader = reader or GGUFReader(str(path))
    names, processor = _hf_names(config, reader, path)
    for name, value in gguf_tensors(reader, path):
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


def gguf_config(path, reader):
    """The transformers config of a GGUF file; the head is tied only when the file has no output.weight."""
    from transformers import AutoConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = not any(t.name == "output.weight" for t in reader.tensors)
    return config


def write_cache(path, out) -> dict:
    """GGUF file -> <out>/weights.safetensors + config.json: codes, scales and offsets as stored,
    4-bit codes two to a byte. Returns {tensor type: count}."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(str(path))
    config = gguf_config(path, reader)
    tensors, meta, counts = {}, {}, {}
    for hf, value in gguf_entries(path, config, reader):
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
    def from_gguf(cls, path, config, reader=None):
        tensors, meta = {}, {}
        for hf, value in gguf_entries(path, config, reader):
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
        codes = self.codes[flat]
        if self.info["packed"]:
            codes = unpack_nibbles(codes)
        offset = None if self.offset is None else self.offset[flat]
        w = dequantize_codes(codes, self.scale[flat], offset, self.info)
        return w.view(*ids.shape, -1).to(ids.device)


def dequantize_codes(codes, scale, offset, info: dict, rows: slice = slice(None)) -> torch.Tensor:
    """(codes - zero) * scale [+ offset] per group, float32, for the given rows."""
    codes, scale = codes[rows], scale[rows]
    n, k = codes.shape
    w = (codes.to(torch.int16) - info["zero"]).float().view(n, -1, info["group"]) * scale[..., None]
    if offset is not None:
        w = w + offset[rows][..., None]
    return w.view(n, k)



def build_model(config, entries: Entries, weights: str, rows: int = 8192, exact_top1: bool = True):
    """A transformers causal LM from codes / float tensors, in the requested weights setting,
    one tensor at a time (the whole float model exists only for fp32 / bf16 / int8-dyn).

    int4: 4-bit tensors (group 32) keep their codes in the int4 kernel's layout; float tensors are
    quantized to int4. With `exact_top1` (a verifier: its top-1 is the output) tensors stored at 5-8
    bits become per-channel int8 (Int8Linear) and the output head re-scores its best logits exactly
    (RescoredHead); without (a drafter: it only proposes, and int8 made it 1.6x slower) they are
    re-quantized to int4 too."""
    from accelerate import init_empty_weights
    from torch import nn
    from transformers import AutoModelForCausalLM

    from .lowbit import (GROUP, Int4Linear, Int8Linear, LowbitEmbedding, RescoredHead, int4_shape_ok,
                         int8_shape_ok, quantize_int4, to_int8_dynamic)

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    have = entries.keys()
    head = model.get_output_embeddings()

    def source(name):
        if name in have:
            return name
        if name == "lm_head.weight" and "model.embed_tokens.weight" in have:  # a tied head
            return "model.embed_tokens.weight"
        raise KeyError(f"the weights have no {name}")

    def dense(name):
        name = source(name)
        w = entries.dequantize(name) if entries.is_codes(name) else entries.float(name)
        return nn.Parameter(w.to(dtype), requires_grad=False)

    def chunks(name, n):
        return (entries.dequantize(name, slice(i, i + rows)) for i in range(0, n, rows))

    def int4_chunks(name):
        codes, scale, offset, info = entries.codes(name)
        for i in range(0, codes.shape[0], rows):
            part = slice(i, i + rows)
            if info["bits"] == 4 and info["group"] == GROUP:  # Q4_K / Q4_0 / Q4_1: the same numbers, re-packed
                s = scale[part].float()
                zero = (8 - info["zero"]) * s + (offset[part].float() if offset is not None else 0)
                yield codes[part], s, zero
            else:  # 5-, 6-, 8-bit or group 16: re-quantized to 4 bits from the exact values
                yield quantize_int4(dequantize_codes(codes, scale, offset, info, part))

    def low_bit(module, w, bias):
        """The int4-setting module for linear `module` with weight tensor `w`, or None (stays float)."""
        n, k = module.out_features, module.in_features
        if not entries.is_codes(w):
            if not int4_shape_ok(n, k):
                return None
            return Int4Linear.from_codes((quantize_int4(entries.float(w)[i:i + rows]) for i in range(0, n, rows)), bias)
        info = entries.meta[w]
        exact4 = info["bits"] == 4 and info["group"] == GROUP
        if module is head and exact_top1 and int4_shape_ok(n, k):
            return RescoredHead(Int4Linear.from_codes(int4_chunks(w), bias), entries.exact_rows(w))
        if (exact4 or not exact_top1) and int4_shape_ok(n, k):
            return Int4Linear.from_codes(int4_chunks(w), bias)
        if int8_shape_ok(n, k):
            return Int8Linear.from_float(chunks(w, n), bias)
        return None

    for name, module in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        if isinstance(module, nn.Linear):
            w = source(f"{name}.weight")
            bias = entries.float(f"{name}.bias") if module.bias is not None else None
            new = low_bit(module, w, bias) if weights == "int4" else None
            if new is not None:
                setattr(holder, child, new)
            else:
                module.weight = dense(w)
                if bias is not None:
                    module.bias = nn.Parameter(bias.to(dtype), requires_grad=False)
        elif isinstance(module, nn.Embedding):
            w = source(f"{name}.weight")
            if weights == "int4" and entries.is_codes(w):
                codes, scale, offset, info = entries.codes(w, unpack=False)
                setattr(holder, child, LowbitEmbedding(codes, scale, offset, info["zero"], info["group"],
                                                       module.padding_idx, packed=info["packed"]))
            else:
                module.weight = dense(w)
    for name, param in list(model.named_parameters()):
        if param.is_meta:  # norms and anything else: plain float tensors
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, dense(name))
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"buffer {name} was not initialised")
    model.eval()
    if weights == "int8-dyn":
        to_int8_dynamic(model)
    elif weights == "int4":
        from .lowbit import choose_kernels

        choose_kernels(model)
    return model
