"""The codes of fp32 weights that are a GGUF's Q4_1 or Q8_0 blocks, found from the weights alone.

A GGUF model run in fp32 (the embedded SmolLM2 is Q4_1, its tied embedding Q8_0) holds weights
the loader dequantized: per 32 inputs of an output, d * q + m (Q4_1: q in 0..15, d and m fp16)
or d * q (Q8_0: q in -127..127, d fp16), the product exact in fp32, so one rounding. Those
values need only their codes and one or two numbers a block: held with fp32 scales, 0.75 and
1.125 bytes a weight, not 4.
avx2_quant_linear.c's dense_order codes sum them as the fp32 weights are summed, so the layer's
outputs keep their bits; Avx2Fp32Linear.narrow_to_codes checks that on the kernel's own values.

Q4_1's quantizer gives its block minimum q = 0 and its maximum q = 15, so m is the block's
smallest value and d the fp16 value nearest (max - m) / 15 or one of its neighbours (the
rounding of 15d + m hides which); Q8_0's gives its largest magnitude q = +-127, so d = amax / 127,
exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GGUF_BLOCK = 32  # inputs a Q4_1 or Q8_0 block scales


@dataclass(frozen=True)
class BlockCodes:
    """weight [N, K] == codes * scale + offset exactly, scale and offset a value per block of
    GGUF_BLOCK inputs ([N, K / 32]); offset None for Q8_0's symmetric blocks."""

    bits: int
    codes: torch.Tensor  # [N, K] int8: 0..15 (4 bits) or -127..127 (8)
    scale: torch.Tensor  # [N, K/32] fp32
    offset: torch.Tensor | None  # [N, K/32] fp32


def block_codes(weight: torch.Tensor) -> BlockCodes | None:
    """The 4-bit (Q4_1-like) or else 8-bit (Q8_0-like) codes whose values are `weight` [N, K]
    (fp32) exactly, or None when neither holds it (or K is not whole blocks)."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % GGUF_BLOCK:
        return None
    blocks = weight.detach().reshape(weight.shape[0], -1, GGUF_BLOCK)  # [N, G, 32]
    return _asymmetric_4bit(blocks) or _symmetric_8bit(blocks)


def _asymmetric_4bit(blocks: torch.Tensor) -> BlockCodes | None:
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)  # [N, G, 1]
    nearest = ((high - low) / 15).to(torch.float16)
    if not torch.isfinite(nearest).all():
        return None
    scale = nearest.float()
    codes, fits = _4bit_codes(blocks, low, scale)
    misses = ~fits  # [N, G]: the few blocks whose d is a neighbour of the nearest fp16
    for step in (-1, 1):
        if not misses.any():
            break
        d = (nearest[misses].view(torch.int16) + step).clamp(min=0).view(torch.float16).float()  # [M, 1]
        q, now = _4bit_codes(blocks[misses], low[misses], d)
        at = misses.nonzero(as_tuple=True)
        codes[at] = torch.where(now[:, None], q, codes[at])
        scale[at] = torch.where(now[:, None], d, scale[at])
        misses[at] = ~now
    if misses.any():
        return None
    return BlockCodes(4, codes.flatten(1), scale.flatten(1), low.flatten(1))


def _4bit_codes(blocks: torch.Tensor, low: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """blocks [..., 32], their minimum and a scale [..., 1] -> codes q [..., 32] int8 and whether
    d * q + low is every value [...]."""
    q = torch.nan_to_num((blocks - low) / d).round_().clamp_(0, 15)  # d = 0: one value, q = 0
    fits = (torch.addcmul(low, d, q) == blocks).all(-1)
    return q.to(torch.int8), fits


def _symmetric_8bit(blocks: torch.Tensor) -> BlockCodes | None:
    d = blocks.abs().amax(-1, keepdim=True) / 127  # [N, G, 1]
    q = torch.nan_to_num(blocks / d).round()  # d = 0: every value 0
    if not ((d * q) == blocks).all():
        return None
    return BlockCodes(8, q.to(torch.int8).flatten(1), d.flatten(1), None)
