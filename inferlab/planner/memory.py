"""Memory formulas: one place, used by the planner and by the engine to size its KV cache."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "fp8": 1, "float8_e4m3fn": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})") from None


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                             bytes_per_element: int) -> int:
    """K and V, for every layer: 2 × layers × kv_heads × head_dim × bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def num_kv_blocks(kv_cache_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Whole blocks of `block_size` tokens that fit in `kv_cache_bytes`."""
    return kv_cache_bytes // (block_size * bytes_per_token)
