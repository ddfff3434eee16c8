"""A small, fast GGUF reader: metadata and tensor index parsed in one pass, tensor data mmapped.

`gguf.GGUFReader` builds a numpy view for every part of every string in the vocabulary, which costs
seconds on a 49k-token vocabulary; this reads the same fields as plain Python values.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

from inferlab.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: str) -> bool:
    """Whether a model path that is no directory is read as GGUF: named .gguf, or opening with
    GGUF's magic (an ollama blob has no extension), as vLLM tells them apart."""
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    type_id: int
    offset: int  # absolute byte offset in the file
    reader: GGUFFile

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"

    def raw(self):
        """The tensor's bytes as numpy: [rows, row bytes] for quantized types, typed otherwise."""
        import numpy as np
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        kind = GGMLQuantizationType(self.type_id)
        block, type_size = GGML_QUANT_SIZES[kind]
        count = 1
        for d in self.shape:
            count *= d
        nbytes = count // block * type_size
        if self.offset + nbytes > len(self.reader.buffer):
            raise ModelLoadError(f"{self.reader.path}: tensor {self.name} runs past the end of "
                                 "the file (truncated?)")
        data = np.frombuffer(self.reader.buffer, dtype=np.uint8, count=nbytes, offset=self.offset)
        rows = count // self.shape[0]
        return data.reshape(rows, -1)


class GGUFFile:
    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            try:
                self.buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # empty file
                raise ModelLoadError(f"{path}: empty file") from None
        self._pos = 0
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError) as e:
            raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from None

    def _read(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buffer, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        value = self.buffer[self._pos:self._pos + n].decode("utf-8", errors="replace")
        if self._pos + n > len(self.buffer):
            raise struct.error("string past end of file")
        self._pos += n
        return value

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._read("<I"), self._read("<Q")
            if item_kind in _SCALARS:
                fmt = _SCALARS[item_kind]
                size = struct.calcsize(fmt)
                values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buffer, self._pos))
                self._pos += size * count
                return values
            return [self._value(item_kind) for _ in range(count)]
        if kind not in _SCALARS:
            raise struct.error(f"unknown metadata type {kind}")
        return self._read(_SCALARS[kind])

    def _parse(self) -> None:
        if self.buffer[:4] != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (bad magic)")
        self._pos = 4
        self.version = self._read("<I")
        num_tensors, num_fields = self._read("<Q"), self._read("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = self._value(self._read("<I"))
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            dims = tuple(self._read("<Q") for _ in range(self._read("<I")))
            infos.append((name, dims, self._read("<I"), self._read("<Q")))
        alignment = int(self.fields.get("general.alignment", 32))
        data_start = -(-self._pos // alignment) * alignment
        self.tensors = [GGUFTensor(n, d, t, data_start + o, self) for n, d, t, o in infos]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)
