"""The CPU quant kernels' weight layouts (inferlab/kernels/cpu/quant_linear.c, dynamic_linear.c)
and their inverses.

All follow the VNNI layouts of the bf16 kernels ([N/16][K/2][16][2]: 16 outputs' weights for a
pair of inputs side by side) or of `vpdpbusd` (quads), so a load decodes into what they multiply:

* int8 pairs [N/16, K/2, 16, 2]: the 1-byte fp8 codes (FP8_DYNAMIC), widened to bf16 pairs.
* int8 quads [N/16, K/4, 16, 4] (W8A8): four inputs per output side by side, the layout of
  AMX's int8 B tiles and of vpdpbusd's signed operand.
* uint8 quads [N/16, K/4, 16, 4] (W8A16): the same with u = q + 128, vpdpbusd's unsigned
  operand, pairs of blocks interleaved as int4's are.
* int4 [N/16, K/8, 64] bytes: one 64-byte line per 16 outputs and 8 inputs holding u = q + 8,
  byte 4j + i holding output j's input i in its low nibble and input 4 + i in its high one: a
  mask gives the line's first input quad as vpdpbusd's unsigned bytes, a shift the second.

In both W8A16 and W4A16 layouts, blocks 2p and 2p + 1, which the kernel reads together,
alternate line by line (the pair is [K/8 or K/4, 2, 64]; an odd last block stays alone), so that
it reads them as one stream. Their group scales and zero points [N, K/G] go block by block,
[N/16, K/G, 16] (pack_block_groups), so that a task reads each block's in order.
"""

from __future__ import annotations

import torch


def pack_int8(codes: torch.Tensor, inputs: int = 2) -> torch.Tensor:
    """[N, K] -> [N/16, K/inputs, 16, inputs]: pairs or quads (W8A8), any 1-byte dtype."""
    n, k = codes.shape
    return codes.reshape(n // 16, 16, k // inputs, inputs).permute(0, 2, 1, 3).contiguous()


def unpack_int8(packed: torch.Tensor) -> torch.Tensor:
    """int8 [N/16, K/w, 16, w] -> int8 [N, K]."""
    blocks, words, _, inputs = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, words * inputs)


def pack_uint8_quads(codes: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> uint8 [N/16, K/4, 16, 4] holding q + 128; pairs of blocks interleaved."""
    quads = pack_int8((codes.to(torch.int16) + 128).to(torch.uint8), inputs=4)
    return _swap_pair_lines(quads.flatten(2), interleave=True).view(quads.shape)


def unpack_uint8_quads(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N/16, K/4, 16, 4] of q + 128 -> int8 codes [N, K]."""
    quads = _swap_pair_lines(packed.flatten(2), interleave=False).view(packed.shape)
    return (unpack_int8(quads).to(torch.int16) - 128).to(torch.int8)


def _int4_line_map() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each of a line's 64 bytes: the output j and the inputs (of the line's 8) in its low
    and high nibble: byte 4j + i holds inputs i and 4 + i of output j."""
    pos = torch.arange(64)
    return pos // 4, pos % 4, 4 + pos % 4


def _swap_pair_lines(blocks: torch.Tensor, interleave: bool) -> torch.Tensor:
    """[N/16, L, 64] block by block <-> the same bytes with each pair's lines alternating."""
    count, lines, _ = blocks.shape
    even = count // 2 * 2
    pairs = blocks[:even].reshape(count // 2, 2, lines, 64) if interleave \
        else blocks[:even].reshape(count // 2, lines, 2, 64)
    return torch.cat([pairs.transpose(1, 2).reshape(even, lines, 64), blocks[even:]])


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] in [-8, 7] -> uint8 [N/16, K/8, 64]: per 16-output block, one 64-byte line per
    8 inputs, nibbles placed by _int4_line_map; pairs of blocks interleaved."""
    n, k = codes.shape
    u = (codes.to(torch.int16) + 8).to(torch.uint8).reshape(n // 16, 16, k // 8, 8)
    j, low, high = _int4_line_map()
    lines = u[:, j, :, low] | (u[:, j, :, high] << 4)  # [64, N/16, K/8]
    return _swap_pair_lines(lines.permute(1, 2, 0), interleave=True)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N/16, K/8, 64] -> int8 codes [N, K] in [-8, 7]."""
    blocks, octets, _ = packed.shape
    j, low, high = _int4_line_map()
    lines = _swap_pair_lines(packed, interleave=False).permute(2, 0, 1)  # [64, N/16, K/8]
    u = torch.empty(blocks, 16, octets, 8, dtype=torch.uint8)
    u[:, j, :, low] = lines & 15
    u[:, j, :, high] = lines >> 4
    return (u.reshape(blocks * 16, octets * 8).to(torch.int16) - 8).to(torch.int8)


def pack_block_groups(per_group: torch.Tensor) -> torch.Tensor:
    """Group scales or zero points [N, K/G] -> [N/16, K/G, 16]: a 16-output block's groups one
    after another."""
    n, groups = per_group.shape
    return per_group.reshape(n // 16, 16, groups).transpose(1, 2).contiguous()


def unpack_block_groups(packed: torch.Tensor) -> torch.Tensor:
    """[N/16, K/G, 16] -> [N, K/G]."""
    blocks, groups, _ = packed.shape
    return packed.transpose(1, 2).reshape(blocks * 16, groups)
