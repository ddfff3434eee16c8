"""A complete tiny llama GGUF (weights and a byte-level BPE tokenizer), written byte by byte from
the GGUF specification, so that tests can break what `gguf.GGUFWriter` never writes wrong: the
version, the alignment, a tensor's dimensions, type or data offset, a name given twice."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS = 64, 96, 4, 2
HEAD_DIM = HIDDEN // HEADS
TOKENS = [chr(c) for c in range(ord("a"), ord("p"))] + ["ab"]  # 16, and the merge's result
F32, Q4_0, Q8_0, Q3_K, Q4_K = 0, 2, 8, 11, 12  # ggml type ids
_UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64 = 4, 5, 6, 7, 8, 9, 10


@dataclass
class Raw:
    """A metadata value written as given: its type id and bytes (a length or count that lies)."""

    data: bytes


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: fastest-varying first
    type_id: int
    data: bytes
    offset: int | None = None  # from the data section's start; None: after the previous one


def llama_tensors(seed: int = 0, vocab_size: int = len(TOKENS)) -> list[Tensor]:
    """One layer's F32 tensors, in llama.cpp's names."""
    shapes = {"token_embd.weight": (vocab_size, HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
              "blk.0.attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              "blk.0.attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              "blk.0.attn_output.weight": (HIDDEN, HIDDEN), "blk.0.ffn_gate.weight": (FFN, HIDDEN),
              "blk.0.ffn_up.weight": (FFN, HIDDEN), "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    rng = np.random.default_rng(seed)
    return [Tensor(name, tuple(reversed(shape)), F32,
                   (rng.standard_normal(shape) * 0.1).astype(np.float32).tobytes())
            for name, shape in shapes.items()]


def llama_metadata(**changes: object) -> dict[str, object]:
    """Hyper-parameters and tokenizer; a change of None drops the key."""
    metadata = {"general.architecture": "llama", "llama.block_count": 1,
                "llama.context_length": 128, "llama.embedding_length": HIDDEN,
                "llama.feed_forward_length": FFN, "llama.attention.head_count": HEADS,
                "llama.attention.head_count_kv": KV_HEADS,
                "llama.attention.layer_norm_rms_epsilon": 1e-5,
                "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": TOKENS,
                "tokenizer.ggml.merges": ["a b"], **changes}
    return {key: value for key, value in metadata.items() if value is not None}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value: object) -> bytes:
    """Type id and bytes: bools as bool, ints as uint32 (int32 below 0, uint64 past 32 bits),
    floats as float32, lists as arrays of their first item's type."""
    if isinstance(value, Raw):
        return value.data
    if isinstance(value, str):
        return struct.pack("<I", _STRING) + _string(value)
    if isinstance(value, bool):
        return struct.pack("<I?", _BOOL, value)
    if isinstance(value, float):
        return struct.pack("<If", _FLOAT32, value)
    if isinstance(value, list):
        items = [_value(item) for item in value]  # each an item type and its bytes
        kind = items[0][:4] if items else struct.pack("<I", _STRING)
        return struct.pack("<I", _ARRAY) + kind + struct.pack("<Q", len(value)) + b"".join(
            item[4:] for item in items)
    if value < 0:
        return struct.pack("<Ii", _INT32, value)
    return struct.pack("<II", _UINT32, value) if value < 2**32 else struct.pack("<IQ", _UINT64, value)


def _pad(blob: bytes, alignment: int) -> bytes:
    return blob.ljust(-(-len(blob) // alignment) * alignment, b"\0")


def write_gguf(path: Path, tensors: list[Tensor] | None = None,
               metadata: dict[str, object] | None = None, version: int = 3,
               alignment: int = 32) -> Path:
    """The file as the spec lays it out: header, key/values, tensor infos, then each tensor's
    data padded to `alignment` (which general.alignment may contradict)."""
    tensors = llama_tensors() if tensors is None else tensors
    metadata = llama_metadata() if metadata is None else metadata
    data, infos = b"", b""
    for tensor in tensors:
        offset = len(data) if tensor.offset is None else tensor.offset
        data = _pad(data.ljust(offset, b"\0") + tensor.data, alignment)
        infos += (_string(tensor.name) + struct.pack("<I", len(tensor.dims))
                  + b"".join(struct.pack("<Q", d) for d in tensor.dims)
                  + struct.pack("<IQ", tensor.type_id, offset))
    header = (b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
              + b"".join(_string(k) + _value(v) for k, v in metadata.items()) + infos)
    path.write_bytes(_pad(header, alignment) + data)
    return path
