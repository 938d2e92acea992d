"""A GGUF file's header read in one walk, its tensors as views of a memory map.

gguf's GGUFReader turns every value of the header into numpy views, the 151,643 tokens and merges of a Qwen
vocabulary included: 16 s a file on the 2-core VM, and transformers' config and tokenizer loaders each open
another (a first start paid it seven times). What building a model needs is the scalars (the config), the
tensor table and the data; a string array is kept as its length (the vocabulary's size) unless asked for by name.
The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3, little-endian).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # slowest dimension first, as torch and numpy hold it
    type: str               # the ggml type's name: "Q4_K", "F32", ...
    data: np.ndarray        # uint8 view of the tensor's bytes in the memory map (read only where used)
    offset: int = 0         # where those bytes start in the file


class GgufFile:
    """metadata: {key: value}, string arrays as their lengths unless named in `strings`; tensors: [TensorEntry]."""

    def __init__(self, path, strings: tuple[str, ...] = ()):
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = str(path)
        self.blob = np.memmap(self.path, mode="r", dtype=np.uint8)
        self._pos = 0
        if bytes(self.blob[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file (it does not start with the GGUF magic)")
        version, tensor_count, kv_count = self._unpack("<4xIQQ")
        if version not in (2, 3):
            raise ValueError(f"{self.path} is GGUF version {version}; versions 2 and 3 are read")
        self.metadata = {}
        for _ in range(kv_count):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("<I")[0], key in strings)
        table = []
        for _ in range(tensor_count):
            name = self._string()
            dims = self._unpack(f"<{self._unpack('<I')[0]}Q")
            kind, offset = self._unpack("<IQ")
            table.append((name, tuple(reversed(dims)), GGMLQuantizationType(kind), offset))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = []
        for name, shape, kind, offset in table:
            block, nbytes = GGML_QUANT_SIZES[kind]
            size = int(np.prod(shape)) // block * nbytes
            begin = start + offset
            if begin + size > len(self.blob):
                raise ValueError(f"{self.path}: tensor {name} ends past the end of the file (a truncated download?)")
            self.tensors.append(TensorEntry(name, shape, kind.name, self.blob[begin:begin + size], begin))

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}

    def _unpack(self, fmt: str) -> tuple:
        try:
            values = struct.unpack_from(fmt, self.blob, self._pos)
        except struct.error:
            raise ValueError(f"{self.path} ends inside its header, at byte {self._pos} of {len(self.blob)} "
                             "(a truncated download?)") from None
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        self._pos += length
        return bytes(self.blob[self._pos - length:self._pos]).decode("utf-8")

    def _value(self, kind: int, keep_strings: bool):
        if kind in SCALARS:
            return self._unpack(SCALARS[kind])[0]
        if kind == STRING:
            return self._string()
        if kind != ARRAY:
            raise ValueError(f"{self.path}: a metadata value of unknown type {kind}")
        item, count = self._unpack("<IQ")
        if item in SCALARS:
            return list(self._unpack(f"<{count}{SCALARS[item][1]}"))
        if item == STRING and keep_strings:
            return [self._string() for _ in range(count)]
        if item != STRING:
            return [self._value(item, keep_strings) for _ in range(count)]
        for _ in range(count):  # the vocabulary or the merges: only their number is needed here
            (length,) = self._unpack("<Q")
            self._pos += length
        return count
