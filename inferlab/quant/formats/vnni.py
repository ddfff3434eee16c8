"""The CPU quant kernels' weight layouts (inferlab/kernels/cpu/quant_linear.c, w8a8_linear.c)
and their inverses.

All follow the bf16 kernels' VNNI layout [N/16][K/2][16][2] (16 outputs' weights for a pair of
inputs side by side), so a load decodes into what `vdpbf16ps` (or `vpdpbusd`) multiplies:

* int8 [N/16, K/2, 16, 2]: the signed codes q.
* int8 quads [N/16, K/4, 16, 4] (W8A8): four inputs per output side by side, the layout of
  AMX's int8 B tiles and of vpdpbusd.
* int4 [N/16, K/4, 16, 2] bytes: byte (j, t) of input quad k holds u = q + 8 of output j for
  input k + t in its low nibble and for input k + 2 + t in its high one.
"""

from __future__ import annotations

import torch


def pack_int8(codes: torch.Tensor, inputs: int = 2) -> torch.Tensor:
    """int8 [N, K] -> int8 [N/16, K/inputs, 16, inputs]: pairs (W8A16) or quads (W8A8)."""
    n, k = codes.shape
    return codes.reshape(n // 16, 16, k // inputs, inputs).permute(0, 2, 1, 3).contiguous()


def unpack_int8(packed: torch.Tensor) -> torch.Tensor:
    """int8 [N/16, K/w, 16, w] -> int8 [N, K]."""
    blocks, words, _, inputs = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, words * inputs)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] in [-8, 7] -> uint8 [N/16, K/4, 16, 2]."""
    n, k = codes.shape
    u = (codes.to(torch.int16) + 8).to(torch.uint8).reshape(n // 16, 16, k // 4, 2, 2)  # [.., quad, h, t]
    return (u[..., 0, :] | (u[..., 1, :] << 4)).permute(0, 2, 1, 3).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N/16, K/4, 16, 2] -> int8 codes [N, K] in [-8, 7]."""
    blocks, quads = packed.shape[:2]
    halves = torch.stack([packed & 15, packed >> 4], dim=-2)  # [N/16, K/4, 16, h, t]
    u = halves.permute(0, 2, 1, 3, 4).reshape(blocks * 16, quads * 4)
    return (u.to(torch.int16) - 8).to(torch.int8)

