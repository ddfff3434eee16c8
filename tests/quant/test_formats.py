"""Pack/unpack pairs round-trip exactly, and our packing is compressed-tensors' own."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.quant.formats import int4_cpu
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
