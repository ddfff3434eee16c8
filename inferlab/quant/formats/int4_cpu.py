"""torch's CPU int4 weight layout (`_convert_weight_to_int4pack_for_cpu`) and its inverse.

The kernel `_weight_int4pack_mm_for_cpu` wants weights as unsigned nibbles (q + 8) in a blocked
layout: output channels in blocks of BLOCK_N (64 with AVX512, 32 otherwise); each block stored
as [K, BLOCK_N/2] bytes. A full block on AVX512/AVX2 holds row j in the low nibble and row
j + BLOCK_N/2 in the high nibble of byte j; a partial block (and every block without vector
units) holds rows 2j and 2j+1. Unpacking lets the large-batch path dequantize without keeping a
second copy of the weight. `layout_is_known()` checks this against the running torch once.
"""

from __future__ import annotations

import functools

import torch

SUPPORTED_GROUP_SIZES = (32, 64, 128, 256)  # BLOCK_K values the CPU kernel is built for
N_MULTIPLE = 16  # a partial block must hold 16, 32 or 48 rows


def block_n() -> int:
    return 64 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 32


def _halves_in_full_blocks() -> bool:
    return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX")


def can_pack(n: int, k: int, group_size: int) -> bool:
    """Whether the CPU kernel accepts an [n, k] weight with this group size."""
    return n % N_MULTIPLE == 0 and k % group_size == 0 and group_size in SUPPORTED_GROUP_SIZES


def to_int4pack(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] in [-8, 7] -> uint8 [N, K/2] in the kernel's layout."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu((q.to(torch.int32) + 8), 1)


def unpack_nibbles(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 kernel layout -> uint8 [N, K] unsigned nibbles (q + 8), rows in natural order."""
    flat = packed.reshape(-1)
    out = torch.empty(n, k, dtype=torch.uint8, device=packed.device)
    bn = block_n()
    full = n // bn * bn
    if full:
        b = flat[: full * k // 2].view(full // bn, k, bn // 2)  # [NB, K, BN/2]
        lo, hi = b & 15, b >> 4
        if _halves_in_full_blocks():
            rows = torch.cat([lo, hi], dim=2)  # [NB, K, BN]
        else:
            rows = torch.stack([lo, hi], dim=3).view(full // bn, k, bn)
        out[:full] = rows.permute(0, 2, 1).reshape(full, k)
    if full < n:
        tail = n - full
        b = flat[full * k // 2:].view(k, tail // 2)  # [K, tail/2]
        out[full:] = torch.stack([b & 15, b >> 4], dim=2).view(k, tail).t()
    return out


def from_int4pack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of to_int4pack: int8 [N, K] in [-8, 7]."""
    return unpack_nibbles(packed, n, k).to(torch.int8) - 8


@functools.cache
def layout_is_known() -> bool:
    """Round-trip a weight with full and partial blocks through torch's packer once."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (block_n() + 16, 64), generator=gen, dtype=torch.int8)
    try:
        return torch.equal(from_int4pack(to_int4pack(q), *q.shape), q)
    except RuntimeError:
        return False
