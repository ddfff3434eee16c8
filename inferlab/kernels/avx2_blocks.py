"""The layout of inferlab/kernels/cpu/avx2_quant_linear.c (dense fp32, W8A16, W4A16 for fp32 on
AVX2 CPUs).

Blocks of 8 outputs, one fp32 lane each, the outputs padded to whole blocks (zero codes and
scales); per block and 8 inputs:

* int8 [N/8, K, 8]: the 8 outputs' codes for an input side by side (one sign-extending load).
* int4 [N/8, K/8, 8, 4] bytes: a 32-bit lane per output holding u = q + 8 of its 8 inputs,
  input i in bits 4i..4i+3 (a shift and a mask per input).

* W8A8 int8 [N/8, K/2, 8, 2] (pack_pairs): per pair of inputs the 8 outputs' two codes side by
  side, for avx2_dynamic_linear.c's vpmaddwd (its FP8 codes take the int8 layout above).

Scales and offsets fp32 [N/8, K/G, 8] (a block's groups in the order it reads them), the
weight being u * scale + offset: offset = -zero * scale for int8, -(zero + 8) * scale for int4;
symmetric weights store no offsets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 8  # outputs a block (an AVX2 register of fp32)


def blocked(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N/8, 8, C], zero rows added up to a whole block."""
    padded = F.pad(t, (0, 0, 0, -t.shape[0] % BLOCK))  # [N8, C]
    return padded.view(-1, BLOCK, t.shape[1])


def outputs_last(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N/8, C, 8]: a block's 8 outputs side by side (dense fp32 weights, int8 codes,
    scales)."""
    return blocked(t).transpose(1, 2).contiguous()


def fits(n: int, k: int, group: int) -> bool:
    """Whole 8-input steps, each within one group."""
    return n > 0 and k % 8 == 0 and group % 8 == 0 and k % group == 0


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int8 codes [N, K] -> uint8 in the kernel's layout (above)."""
    if bits == 8:
        return outputs_last(codes).view(torch.uint8)  # [N/8, K, 8]
    u = blocked(codes.to(torch.int16) + 8)  # [N/8, 8, K]; padding u = 0
    u = u.view(u.shape[0], BLOCK, -1, 4, 2)  # [N/8, 8 outputs, K/8, 4 bytes, 2 nibbles]
    pairs = (u[..., 0] | (u[..., 1] << 4)).to(torch.uint8)  # [N/8, 8, K/8, 4]
    return pairs.transpose(1, 2).contiguous()  # [N/8, K/8, 8, 4]


def pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [N, K] (K even) -> int8 [N/8, K/2, 8, 2], zero codes past N."""
    b = blocked(codes)  # [N/8, 8, K]
    return b.view(b.shape[0], BLOCK, -1, 2).transpose(1, 2).contiguous()


def pack_group_params(scale: torch.Tensor, zero: torch.Tensor | None, bits: int
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """scale, zero point [N, G] -> (scale, offset) fp32 [N/8, G, 8]; no offset without zero
    points (the kernel takes -8 * scale for int4, 0 for int8)."""
    if zero is None:
        return outputs_last(scale.float()), None
    shift = zero.double() + (8 if bits == 4 else 0)
    offset = (-shift * scale.double()).float()  # one rounding
    return outputs_last(scale.float()), outputs_last(offset)
