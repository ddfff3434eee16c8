"""The codes of fp32 weights that are a GGUF's Q4_1, Q4_0 or Q8_0 blocks, found from the weights
alone.

A GGUF model run in fp32 (the embedded SmolLM2 is Q4_1, its tied embedding Q8_0) holds weights
the loader dequantized: per 32 inputs of an output, d * q + m (Q4_1: q in 0..15, d and m fp16),
d * (q - 8) (Q4_0: q in 0..15, d fp16) or d * q (Q8_0: q in -127..127, d fp16), the product
exact in fp32, so at most one rounding. Those values need only their codes and one or two
numbers a block: held with fp32 scales, 0.75 and 1.125 bytes a weight, not 4.
avx2_quant_linear.c's dense_order codes sum them as the fp32 weights are summed, so the layer's
outputs keep their bits; Avx2Fp32Linear.narrow_to_codes checks that on the kernel's own values.

Q4_1's quantizer gives its block minimum q = 0 and its maximum q = 15, so m is the block's
smallest value and d the fp16 value nearest (max - m) / 15 or one of its neighbours (the
rounding of 15d + m hides which); Q4_0's gives its largest magnitude q = 0, the value -8d, so d
is that value / -8 and the codes are Q4_1's with m = -8d; Q8_0's gives its largest magnitude
q = +-127, so d = amax / 127, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferlab.kernels.cpu_library import library

GGUF_BLOCK = 32  # inputs a Q4_1, Q4_0 or Q8_0 block scales


@dataclass(frozen=True)
class BlockCodes:
    """weight [N, K] == codes * scale + offset exactly, scale and offset a value per block of
    GGUF_BLOCK inputs ([N, K / 32]); offset None for Q8_0's symmetric blocks."""

    bits: int
    codes: torch.Tensor  # [N, K] int8: 0..15 (4 bits) or -127..127 (8)
    scale: torch.Tensor  # [N, K/32] fp32
    offset: torch.Tensor | None  # [N, K/32] fp32


def block_codes(weight: torch.Tensor) -> BlockCodes | None:
    """The 4-bit (Q4_1- or Q4_0-like) or else 8-bit (Q8_0-like) codes whose values are `weight` [N, K]
    (fp32) exactly, or None when neither holds it, K is not whole blocks, or the C kernels (which
    find them, cpu/block_codes.c, and which run them) are not built."""
    lib = library()
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % GGUF_BLOCK or lib is None:
        return None
    w = weight.detach().contiguous()
    codes = torch.empty(w.shape, dtype=torch.int8)
    scale = torch.empty(w.shape[0], w.shape[1] // GGUF_BLOCK)
    offset = torch.empty_like(scale)
    blocks = scale.numel()
    if not lib.block_codes_4bit(w.data_ptr(), blocks, codes.data_ptr(), scale.data_ptr(), offset.data_ptr()):
        return BlockCodes(4, codes, scale, offset)
    if not lib.block_codes_8bit(w.data_ptr(), blocks, codes.data_ptr(), scale.data_ptr()):
        return BlockCodes(8, codes, scale, None)
    return None
