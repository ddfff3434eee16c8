"""A metadata-only GGUF file (the embedding and one layer's norm) for the config readers' tests,
written by `gguf`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SHAPE = {"embedding_length": 64, "feed_forward_length": 96, "block_count": 1,
         "attention.head_count": 4, "context_length": 128, "vocab_size": 16}


def write_tiny_gguf(path: Path, **metadata: int | float | str | bool | list) -> Path:
    """A llama GGUF with SHAPE's hyper-parameters, unless `metadata` gives them, plus `metadata`
    (key: value, typed by value)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in SHAPE.items():
        if f"llama.{key}" not in metadata:
            writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((16, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(64, dtype=np.float32))  # block_count is 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
