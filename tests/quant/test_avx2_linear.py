"""W8A16 and W4A16 for fp32 on AVX2 + FMA CPUs (avx2_quant_linear.c, Avx2QuantLinear) against
the product in float64 with the weight dequantized by hand from the codes, scales and zero
points; W8A8 (avx2_dynamic_linear.c, Avx2DynamicLinear) against the int8 GEMM's bits."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from inferlab.kernels import avx2_blocks, cpu_ops
from inferlab.quant import linear
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.linear_dynamic import Avx2DynamicLinear, Int8DynamicLinear
from inferlab.quant.qparams import QuantizedWeight, dequantize, quantize_rtn
from inferlab.quant.scheme import CHANNEL, GROUP, INT, WeightArgs, make_scheme

pytestmark = pytest.mark.skipif(not cpu_ops.avx2_quant_linear_available(),
                                reason="avx2_quant_linear.c is not built here (no AVX2 + FMA, or no compiler)")

# (bits, group size or None per channel, asymmetric): both widths, both kinds of scales, and
# zero points, which int4 adds 8 to (its codes are stored as u = q + 8)
WEIGHTS = [(8, None, False), (8, None, True), (8, 32, False), (8, 64, True),
           (4, None, False), (4, None, True), (4, 64, False), (4, 32, True)]


def quantized(n: int, k: int, bits: int, group: int | None, asym: bool, seed: int) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    args = WeightArgs(bits, INT, CHANNEL if group is None else GROUP, group, not asym)
    return quantize_rtn(torch.randn(n, k, generator=gen), args)


def by_hand(qw: QuantizedWeight) -> torch.Tensor:
    """(codes - zero point) * scale (one fp32 rounding), independently of the layer's packing."""
    return dequantize(qw.codes, qw.scale, qw.zero_point).double()


@pytest.mark.parametrize(("bits", "group", "asym"), WEIGHTS)
# 1 and 3: partial row tiles; 16: four full tiles of 4; 100: the dequantizing path
@pytest.mark.parametrize("rows", [1, 3, 16, 100])
def test_matches_the_float64_product_of_the_weight_dequantized_by_hand(bits, group, asym, rows) -> None:
    """203 outputs (25 blocks of 8 and a partial one) by 320 inputs, with a bias: every output
    within 1e-5 of the largest, as fp32 sums of 320 products allow."""
    qw = quantized(203, 320, bits, group, asym, seed=rows)
    gen = torch.Generator().manual_seed(rows + 1)
    bias = torch.randn(203, generator=gen)
    layer = build_quant_linear(qw, None, bias, torch.float32)
    assert isinstance(layer, linear.Avx2QuantLinear)
    x = torch.randn(2, rows, 320, generator=gen)
    expected = x.double() @ by_hand(qw).T + bias.double()  # [2, rows, 203]
    out = layer(x)
    assert out.shape == (2, rows, 203) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize(("bits", "group", "asym"), WEIGHTS)
def test_dequantized_weight_is_the_weight_by_hand(bits, group, asym) -> None:
    """What other code reads of the layer (checkpoint checks, 2:4 sparsity): the weight itself,
    to fp32's rounding of the zero point's offset, and unpadded (N = 13 is not whole blocks)."""
    qw = quantized(13, 64, bits, group, asym, seed=bits)
    layer = build_quant_linear(qw, None, None, torch.float32)
    held = layer.dequantized_weight()
    assert held.shape == (13, 64) and held.dtype == torch.float32
    torch.testing.assert_close(held.double(), by_hand(qw), rtol=0, atol=1e-6 * by_hand(qw).abs().max().item())


def test_hand_checked_int4_codes_and_zero_point() -> None:
    """One output, 8 inputs in one group: codes -8..7 at the extremes, zero point 2, scale 0.5:
    w = (q - 2) * 0.5, and x = e_i picks w[i] out exactly."""
    codes = torch.tensor([[-8, 7, 0, -1, 3, 2, 5, -4]], dtype=torch.int8)
    qw = QuantizedWeight(codes, torch.tensor([[0.5]]), torch.tensor([[2]], dtype=torch.int8),
                         WeightArgs(4, INT, GROUP, 8, False))
    layer = build_quant_linear(qw, None, None, torch.float32)
    out = layer(torch.eye(8))  # [8, 1]
    assert out[:, 0].tolist() == [-5.0, 2.5, -1.0, -1.5, 0.5, 0.0, 1.5, -3.0]


@pytest.mark.parametrize(("bits", "group", "asym"), [(8, None, True), (4, 32, True), (4, None, False)])
def test_a_row_gets_the_bits_it_gets_alone(bits, group, asym) -> None:
    """Each row sums its products in one order whatever tile of 4 rows it shares: a request's
    outputs do not depend on the decode batch around it (M = 1 against the same row among 2 to
    AVX2_KERNEL_MAX_ROWS rows: every remainder of a tile, at every place in it)."""
    qw = quantized(72, 256, bits, group, asym, seed=7)
    layer = build_quant_linear(qw, None, torch.randn(72), torch.float32)
    gen = torch.Generator().manual_seed(3)
    most = linear.AVX2_KERNEL_MAX_ROWS
    x = torch.randn(most, 256, generator=gen) * torch.rand(most, 1, generator=gen) * 8  # [most, 256]
    alone = torch.cat([layer(row[None]) for row in x])  # [most, 72]
    for rows in range(2, most + 1):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


@pytest.mark.parametrize(("k", "group"), [(100, None), (96, 12), (60, 20)])
def test_inputs_in_no_whole_steps_of_8_keep_torch_s_layers(k: int, group: int | None) -> None:
    """The kernel reads 8 inputs at a time within a group: K or a group size that is not a
    multiple of 8 is refused, and the layer is one of torch's (here as correct)."""
    qw = quantized(24, k, 4 if group else 8, group, False, seed=k)
    assert not avx2_blocks.fits(24, k, group or k)
    layer = build_quant_linear(qw, None, None, torch.float32)
    assert not isinstance(layer, linear.Avx2QuantLinear)
    x = torch.randn(3, k)
    expected = x.double() @ by_hand(qw).T
    torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_bf16_is_not_taken() -> None:
    """The kernel computes in fp32 only; bf16 keeps its own layers."""
    layer = build_quant_linear(quantized(16, 64, 8, None, False, seed=0), None, None, torch.bfloat16)
    assert not isinstance(layer, linear.Avx2QuantLinear)


def test_a_copy_or_a_moved_layer_reads_its_own_buffers() -> None:
    """The layer keeps its ctypes description (pointers into its buffers) between calls: a deep
    copy must describe the copy's buffers (the original is then freed), and share_memory(),
    which moves the buffers, must not leave the kernel reading the old ones."""
    gen = torch.Generator().manual_seed(11)
    layer = build_quant_linear(quantized(40, 64, 4, 32, True, seed=11), None, torch.randn(40, generator=gen),
                               torch.float32)
    x = torch.randn(2, 64, generator=gen)
    expected = layer(x)
    copied = copy.deepcopy(layer)
    del layer
    assert torch.equal(copied(x), expected)
    copied.share_memory()
    assert torch.equal(copied(x), expected)


@pytest.mark.parametrize("rows", [1, 5, 40, 70])  # tiles of 4 rows and their remainders
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("outputs", [40, 75])  # 75: a last block of 3 outputs, a last tile of 1 block
def test_w8a8_on_avx2_gives_the_int8_gemms_bits(rows: int, static: bool, outputs: int) -> None:
    """The AVX2 kernel quantizes each row as Int8DynamicLinear does and sums the int8 products
    exactly, as torch._int_mm does: the same bits, with a bias and with a static input scale
    (values past it clamp); each row's whatever rows are beside it."""
    gen = torch.Generator().manual_seed(3)
    w, bias = torch.randn(outputs, 96, generator=gen), torch.randn(outputs, generator=gen)
    x = torch.randn(rows, 96, generator=gen) * 3
    x[0, :3] = 0.0
    qw = quantize_rtn(w, make_scheme("W8A8").weights)
    if static:
        qw = dataclasses.replace(qw, input_scale=torch.tensor(4.0 / 127))
    if not Avx2DynamicLinear.fits(qw, make_scheme("W8A8").activations, torch.float32, torch.device("cpu")):
        pytest.skip("no AVX2 kernel here, or an exact int8 GEMM that takes precedence")
    want = Int8DynamicLinear(qw, bias, torch.float32)(x)  # torch._int_mm here: exact int32 sums
    layer = Avx2DynamicLinear(qw, bias, torch.float32)
    got = layer(x)
    assert torch.equal(got, want)
    assert torch.equal(layer(x[-1:]), want[-1:])
    assert torch.equal(layer(torch.zeros(2, 96)), bias.expand(2, -1))  # an all-zero row: scale 1e-12 / 127
