"""A small, fast GGUF reader: metadata and tensor index parsed in one pass, tensor data mmapped.

`gguf.GGUFReader` builds a numpy view for every part of every string in the vocabulary, which costs
seconds on a 49k-token vocabulary; this reads the same fields as plain Python values.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferlab.errors import ModelLoadError

if TYPE_CHECKING:  # annotations only: numpy is imported where tensors are read
    import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# the fewest bytes a metadata field (key length, type, a uint8) and a tensor's info (name length,
# dimension count, type, offset) take: a count of more than the file holds is refused up front
_FIELD_MIN_BYTES, _TENSOR_INFO_MIN_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8


GGUF_MAGIC = b"GGUF"
F32_TYPE = 0  # GGMLQuantizationType.F32
MAX_ARRAY_VALUES = 1 << 23  # the largest vocabularies hold ~262k tokens and ~500k merges


def _smallest(kind: int) -> int:
    """Bytes the smallest value of `kind` takes in a file: a string its length, an array its
    item type and count."""
    if kind in _SCALARS:
        return struct.calcsize(_SCALARS[kind])
    if kind not in (_STRING, _ARRAY):
        raise struct.error(f"unknown metadata type {kind}")
    return 8 if kind == _STRING else 12


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


GGUF_VERSIONS = (2, 3)  # v1 counted in 32 bits; llama.cpp reads only these
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml pads every shape to 4 dimensions with 1s
DEFAULT_ALIGNMENT = 32


def _align_up(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _past_end(tensor: GGUFTensor) -> ModelLoadError:
    return ModelLoadError(f"{tensor.path}: tensor {tensor.name} runs past the end of the file "
                          "(truncated?)")


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    type_id: int
    offset: int  # absolute byte offset in the file
    path: str
    # The file's mapping, not the GGUFFile: a reference back would make a cycle that only the
    # collector frees, and an engine's gc.freeze() once kept such mappings (and fds) for good.
    buffer: mmap.mmap = field(repr=False)

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"

    def row_bytes(self) -> int:
        """Bytes of one row (shape[0] values); rows that are no whole number of blocks are
        refused, as llama.cpp refuses them."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        except ValueError:
            raise ModelLoadError(f"{self.path}: tensor {self.name} has unknown type "
                                 f"{self.type_id}") from None
        if self.shape[0] % block:
            raise ModelLoadError(f"{self.path}: tensor {self.name} of type {self.type_name} has "
                                 f"rows of {self.shape[0]} values, not a multiple of its block "
                                 f"size {block}")
        return self.shape[0] // block * type_size

    def nbytes(self) -> int:
        return math.prod(self.shape[1:]) * self.row_bytes()

    def f32_values(self) -> list[float]:
        """An F32 tensor's values as Python floats, read without numpy or gguf (the planner
        reads configs without them): for the few small tensors a config holds."""
        if self.type_id != F32_TYPE:
            raise ModelLoadError(f"{self.path}: tensor {self.name} has type {self.type_name}, "
                                 "not F32")
        count = math.prod(self.shape)
        if self.offset + 4 * count > len(self.buffer):
            raise _past_end(self)
        return list(struct.unpack_from(f"<{count}f", self.buffer, self.offset))

    def raw(self) -> np.ndarray:
        """The tensor's bytes as numpy: [rows, row bytes] for quantized types, typed otherwise.
        Read it from GGUFFile.checked_tensors(), which finds its bytes inside the file."""
        import numpy as np

        data = np.frombuffer(self.buffer, dtype=np.uint8, count=self.nbytes(), offset=self.offset)
        return data.reshape(-1, self.row_bytes())


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
        except (struct.error, UnicodeDecodeError, IndexError, RecursionError) as e:
            raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from None

    def _need(self, nbytes: int) -> None:
        """Refuse reading past the end before struct does: its error speaks of buffers and
        unpack_from, not of the file."""
        if self._pos + nbytes > len(self.buffer):
            raise ModelLoadError(f"{self.path}: the file ends inside its GGUF header "
                                 f"({len(self.buffer)} bytes; truncated?)")

    def _read(self, fmt: str) -> Any:
        self._need(struct.calcsize(fmt))
        value = struct.unpack_from(fmt, self.buffer, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _count(self, what: str, min_bytes: int) -> int:
        """A count of `what`s, refused where even the smallest of them would not fit in what
        is left of the file (a count of 2**62 read on, into 'string past end of file')."""
        count = self._read("<Q")
        if count * min_bytes > len(self.buffer) - self._pos:
            raise ModelLoadError(f"{self.path}: {what} count {count} is more than a file of "
                                 f"{len(self.buffer)} bytes can hold")
        return count

    def _string(self) -> str:
        n = self._read("<Q")
        self._need(n)  # before slicing: a length read from tensor data is huge
        end = self._pos + n
        value = self.buffer[self._pos:end].decode("utf-8", errors="replace")
        self._pos = end
        return value

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._read("<I"), self._read("<Q")
            # refused before a list is built: a count read from tensor data is huge, and its
            # values would take many times the file's size before the file ran out
            if count * _smallest(item_kind) > len(self.buffer) - self._pos:
                raise struct.error(f"array of {count} values past end of file")
            # a crafted file's array that fits takes ~36x its bytes as a list of Python ints
            if count > MAX_ARRAY_VALUES:
                raise struct.error(f"metadata array of {count} values (more than the "
                                   f"{MAX_ARRAY_VALUES} any tokenizer needs)")
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
        if self.version not in GGUF_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            hint = " (a big-endian file?)" if swapped in GGUF_VERSIONS else ""
            raise ModelLoadError(f"{self.path}: GGUF version {self.version} is not supported "
                                 f"(supported: 2, 3){hint}")
        num_tensors = self._count("tensor", _TENSOR_INFO_MIN_BYTES)
        num_fields = self._count("metadata field", _FIELD_MIN_BYTES)
        self.fields: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = self._value(self._read("<I"))
        infos = [self._tensor_info() for _ in range(num_tensors)]
        self.alignment = self._alignment()
        self._data_start = _align_up(self._pos, self.alignment)
        self.tensors = [GGUFTensor(n, d, t, self._data_start + o, self.path, self.buffer)
                        for n, d, t, o in infos]
        names = [t.name for t in self.tensors]
        if len(set(names)) < len(names):  # llama.cpp and gguf's reader refuse them too
            twice = next(n for n in names if names.count(n) > 1)
            raise ModelLoadError(f"{self.path}: tensor {twice} is in the file twice")

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name, ndims = self._string(), self._read("<I")
        if ndims > MAX_DIMS:
            raise ModelLoadError(f"{self.path}: tensor {name} has {ndims} dimensions (at most "
                                 f"{MAX_DIMS})")
        dims = tuple(self._read("<Q") for _ in range(ndims))
        if 0 in dims:
            raise ModelLoadError(f"{self.path}: tensor {name} has shape {dims}, with a dimension "
                                 "of 0")
        # trailing 1s are ggml's padding: (256, 256, 1) is the matrix (256, 256), as llama.cpp
        # reads it
        while dims and dims[-1] == 1:
            dims = dims[:-1]
        return name, dims or (1,), self._read("<I"), self._read("<Q")

    def _alignment(self) -> int:
        """general.alignment: a power of two (a uint32 in llama.cpp, which refuses any other)."""
        value = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(value) is not int or value <= 0 or value & (value - 1):
            raise ModelLoadError(f"{self.path}: GGUF metadata general.alignment is {value!r}, "
                                 "not a power of two")
        return value

    def checked_tensors(self) -> list[GGUFTensor]:
        """The tensors, once their data is found where llama.cpp reads it: each one's right after
        the one before, padded to the alignment, and inside the file; so no tensor reads
        another's bytes. Not done at parse: it imports gguf, which the planner goes without."""
        expected = self._data_start
        for tensor in self.tensors:
            if tensor.offset != expected:
                raise ModelLoadError(
                    f"{self.path}: tensor {tensor.name} has its data at offset "
                    f"{tensor.offset - self._data_start}, not {expected - self._data_start} "
                    "(tensor data overlapping or out of order)")
            end = tensor.offset + tensor.nbytes()
            if end > len(self.buffer):
                raise _past_end(tensor)
            expected = _align_up(end, self.alignment)
        return self.tensors

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)
