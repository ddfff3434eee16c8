"""compressed-tensors' `pack-quantized` layout: signed b-bit integers packed into int32 words.

Each value is stored offset by 2^(b-1) (so it is non-negative) and 32/b values share a word,
value j of a word at bits b*j. Weights are packed along the input dimension (rows stay whole,
so output-channel shards concatenate exactly); asymmetric zero points along the output
dimension (dim 0). b must divide 32: 4 and 8 are what the schemes use.
"""

from __future__ import annotations

import torch

PACKABLE_BITS = (2, 4, 8)


def _check_bits(num_bits: int) -> int:
    if num_bits not in PACKABLE_BITS:
        raise ValueError(f"packing supports {PACKABLE_BITS} bits per value, got {num_bits}")
    return 32 // num_bits


def pack_int32(values: torch.Tensor, num_bits: int) -> torch.Tensor:
    """int8 [R, C] in [-2^(b-1), 2^(b-1)) -> int32 [R, ceil(C*b/32)], packed along dim 1."""
    per_word = _check_bits(num_bits)
    if values.dtype != torch.int8 or values.dim() != 2:
        raise ValueError(f"expected a 2-d int8 tensor, got {values.dim()}-d {values.dtype}")
    rows, cols = values.shape
    words = -(-cols // per_word)
    unsigned = values.to(torch.int32) + (1 << (num_bits - 1))  # [R, C] in [0, 2^b)
    padded = torch.nn.functional.pad(unsigned, (0, words * per_word - cols))
    parts = padded.view(rows, words, per_word)  # [R, W, per_word]
    packed = torch.zeros(rows, words, dtype=torch.int32, device=values.device)
    for j in range(per_word):  # OR, never add: the top nibble sets the sign bit
        packed |= parts[:, :, j] << (num_bits * j)
    return packed


def unpack_int32(packed: torch.Tensor, num_bits: int, num_cols: int) -> torch.Tensor:
    """int32 [R, W] -> int8 [R, num_cols]; the inverse of pack_int32."""
    per_word = _check_bits(num_bits)
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"expected a 2-d int32 tensor, got {packed.dim()}-d {packed.dtype}")
    if not (packed.shape[1] - 1) * per_word < num_cols <= packed.shape[1] * per_word:
        raise ValueError(f"{packed.shape[1]} words of {per_word} values cannot hold {num_cols}")
    shifts = torch.arange(0, 32, num_bits, dtype=torch.int32, device=packed.device)
    mask = (1 << num_bits) - 1
    fields = (packed.unsqueeze(-1) >> shifts) & mask  # [R, W, per_word], arithmetic shift then mask
    values = fields.flatten(1)[:, :num_cols] - (1 << (num_bits - 1))
    return values.to(torch.int8)


def pack_zero_points(zero_points: torch.Tensor, num_bits: int) -> torch.Tensor:
    """int8 [N, G] -> int32 [ceil(N*b/32), G]: packed along the output dimension, as vLLM reads it."""
    return pack_int32(zero_points.t().contiguous(), num_bits).t().contiguous()


def unpack_zero_points(packed: torch.Tensor, num_bits: int, num_rows: int) -> torch.Tensor:
    """int32 [ceil(N*b/32), G] -> int8 [N, G]."""
    return unpack_int32(packed.t().contiguous(), num_bits, num_rows).t().contiguous()
