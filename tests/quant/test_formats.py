"""Pack/unpack pairs round-trip exactly, and our packing is compressed-tensors' own."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.quant.formats import int4_cpu, vnni
from inferlab.quant.formats.int_pack import (
    pack_int32,
    pack_zero_points,
    unpack_int32,
    unpack_zero_points,
)


def _codes(rows: int, cols: int, bits: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (rows, cols), generator=gen,
                         dtype=torch.int8)


def test_hand_packed_word() -> None:
    # values 0..7 offset by +8 -> nibbles 8..15, value j at bits 4j: 0xFEDCBA98 as int32
    q = torch.arange(8, dtype=torch.int8).view(1, 8)
    expected = int.from_bytes(bytes.fromhex("98badcfe"), "little", signed=True)
    assert pack_int32(q, 4).tolist() == [[expected]]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 70), bits=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 2**16))
def test_int32_round_trip(rows: int, cols: int, bits: int, seed: int) -> None:
    q = _codes(rows, cols, bits, seed)
    packed = pack_int32(q, bits)
    assert packed.dtype == torch.int32 and packed.shape == (rows, -(-cols * bits // 32))
    assert torch.equal(unpack_int32(packed, bits, cols), q)
    assert torch.equal(unpack_zero_points(pack_zero_points(q, bits), bits, rows), q)


@pytest.mark.parametrize("bits", [4, 8])
def test_matches_compressed_tensors_packing(bits: int) -> None:
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    q = _codes(13, 77, bits, seed=3)
    assert torch.equal(pack_int32(q, bits), helpers.pack_to_int32(q, bits))
    assert torch.equal(pack_zero_points(q, bits), helpers.pack_to_int32(q, bits, packed_dim=0))


def test_unpack_rejects_a_wrong_column_count() -> None:
    packed = pack_int32(_codes(2, 16, 4, 0), 4)  # two words
    with pytest.raises(ValueError):
        unpack_int32(packed, 4, 17)


@pytest.mark.parametrize("rows", [16, 48, 64, 80, 960])  # partial blocks and whole blocks
def test_cpu_int4_layout_round_trip(rows: int) -> None:
    q = _codes(rows, 96, 4, seed=rows)
    packed = int4_cpu.to_int4pack(q)
    assert packed.dtype == torch.uint8 and packed.numel() == rows * 96 // 2
    assert torch.equal(int4_cpu.from_int4pack(packed, rows, 96), q)
    assert int4_cpu.layout_is_known()


@pytest.mark.parametrize(("bits", "rows", "cols"), [(8, 16, 32), (8, 48, 96), (4, 16, 32), (4, 80, 96)])
def test_vnni_layouts_round_trip(bits: int, rows: int, cols: int) -> None:
    q = _codes(rows, cols, bits, seed=rows + bits)
    pack, unpack = (vnni.pack_int8, vnni.unpack_int8) if bits == 8 else (vnni.pack_int4, vnni.unpack_int4)
    packed = pack(q)
    assert packed.numel() * packed.element_size() == rows * cols * bits // 8
    assert torch.equal(unpack(packed), q)


def test_vnni_pairs_of_blocks_alternate_lines() -> None:
    """Blocks 2p and 2p + 1 (16 outputs each) alternate their 64-byte lines; an odd last block
    follows alone. Block b's codes are all b - 8, so every byte of its int4 lines is u | u << 4,
    u = b, and of its W8A16 lines b + 120."""
    q = torch.arange(48).div(16, rounding_mode="floor").sub(8).to(torch.int8)[:, None].expand(48, 16)
    lines = vnni.pack_int4(q.contiguous()).reshape(-1, 64)  # 3 blocks x 2 lines of 8 inputs
    assert [int(line[0]) for line in lines] == [0, 0x11, 0, 0x11, 0x22, 0x22]
    assert all(bool((line == line[0]).all()) for line in lines)
    quads = vnni.pack_uint8_quads(q.contiguous())
    lines = quads.reshape(-1, 64)  # 3 blocks x 4 lines of 4 inputs
    assert [int(line[0]) for line in lines] == [120, 121] * 4 + [122] * 4
    assert all(bool((line == line[0]).all()) for line in lines)
    assert torch.equal(vnni.unpack_uint8_quads(quads), q)


def test_vnni_int4_layout_by_hand() -> None:
    """Output j, input r of a line: byte 4j + r % 4, the low nibble for inputs 0-3, the high
    one for inputs 4-7."""
    q = torch.full((16, 8), -8, dtype=torch.int8)  # u = 0 everywhere but
    q[3, 0], q[3, 4], q[5, 3], q[15, 7] = 1, 7, -1, 0  # u = 9, 15, 7, 8
    line = vnni.pack_int4(q)[0, 0]  # [64]
    assert line[12].item() == 9 | 15 << 4  # output 3, inputs 0 and 4
    assert line[23].item() == 7  # output 5, input 3
    assert line[63].item() == 8 << 4  # output 15, input 7
    assert int(line.to(torch.int32).sum()) == (9 | 15 << 4) + 7 + (8 << 4)
    q8 = torch.arange(64, dtype=torch.int8).view(16, 4)  # [N=16, K=4]
    assert vnni.pack_int8(q8)[0, 1, 2].tolist() == [10, 11]  # output 2, inputs 2 and 3
    quads = vnni.pack_int8(q8, inputs=4)  # W8A8: [1, 1, 16, 4]
    assert quads[0, 0, 2].tolist() == [8, 9, 10, 11] and torch.equal(vnni.unpack_int8(quads), q8)
    offset = vnni.pack_uint8_quads(q8 - 64)  # W8A16: q + 128, unsigned
    assert offset.dtype == torch.uint8 and offset[0, 0, 2].tolist() == [72, 73, 74, 75]
    assert torch.equal(vnni.unpack_uint8_quads(offset), q8 - 64)
