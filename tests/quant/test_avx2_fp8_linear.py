"""FP8_DYNAMIC and FP8 for fp32 on AVX2 + FMA CPUs (avx2_dynamic_linear.c, Avx2DynamicLinear):
activations rounded to fp8 as torch rounds them, every e4m3 code read as its value, and the
exact products summed in fp32, against float64 and torch's own fp8 layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferlab.kernels import cpu_ops
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.linear_dynamic import Avx2DynamicLinear, Fp8DynamicLinear
from inferlab.quant.qparams import QuantizedWeight, quantize_rtn
from inferlab.quant.scheme import make_scheme
from tests.quant.fp8_reference import fp8_reference_round

pytestmark = pytest.mark.skipif(not cpu_ops.avx2_quant_linear_available(),
                                reason="avx2_dynamic_linear.c is not built here (no AVX2 + FMA, or no compiler)")

SCHEME = make_scheme("FP8_DYNAMIC")


def fp8_layer(qw: QuantizedWeight, bias: torch.Tensor | None = None) -> Avx2DynamicLinear:
    activations = (make_scheme("FP8") if qw.input_scale is not None else SCHEME).activations
    layer = build_quant_linear(qw, activations, bias, torch.float32)
    assert type(layer) is Avx2DynamicLinear
    return layer


def with_codes(codes: torch.Tensor) -> QuantizedWeight:
    """fp8 codes [N, K] with weight scale 1."""
    qw = quantize_rtn(torch.ones(codes.shape), SCHEME.weights)
    return QuantizedWeight(codes, torch.ones(codes.shape[0], 1), None, qw.args)


@pytest.mark.parametrize("rows", [1, 3, 5, 33])  # one row decodes as it reads; more widen first
def test_activations_round_as_torch_rounds_them(rows: int) -> None:
    """Through an identity weight (codes 1.0, scale 1) the layer returns each token's fp8
    rounding times its scale: the same bits as torch's float8_e4m3fn conversion, subnormals,
    ties and the +-448 clamp included."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=gen) * torch.exp2(torch.randint(-14, 3, (rows, 64), generator=gen).float())
    x[:, 5] = 56.0  # absmax: scale 56 / 448 = 1 / 8, exactly, so that the ties below are exact
    x[0, 6] = 1.5 * 2.0 ** -12  # 1.5 x the smallest subnormal step (2^-9 of the scale): to even, 2
    x[0, 7] = 2.5 * 2.0 ** -12  # 2.5 steps: to even, 2
    x[0, 8] = 1.0625 * 2.0 ** -3  # halfway between 1 and 1.125 (normal): to even, 1
    layer = fp8_layer(with_codes(torch.eye(64).to(torch.float8_e4m3fn)))
    values, x_scale = fp8_reference_round(x)
    assert values[0, 6:9].tolist() == [2.0 ** -8, 2.0 ** -8, 1.0]
    assert torch.equal(layer(x), values * x_scale)


def test_every_code_reads_as_its_value() -> None:
    """Rows of 448 at one input (scale exactly 1) read the weight back column by column times
    448, exactly: every e4m3 code (subnormals, negative zero, +-448), through one row at a time
    (decoded as read) and all rows at once (widened)."""
    byte = (torch.arange(256)[:, None] + 7 * torch.arange(32)[None, :]) % 256  # [N=256, K=32]
    byte[(byte & 0x7F) == 0x7F] = 0  # e4m3fn's NaNs: never a code
    codes = byte.to(torch.uint8).view(torch.float8_e4m3fn)
    layer = fp8_layer(with_codes(codes))
    expected = codes.float().T * 448  # [K, N]: row k is input k's weights
    one_hot = torch.eye(32) * 448
    assert torch.equal(layer(one_hot), expected)
    assert torch.equal(torch.cat([layer(row[None]) for row in one_hot]), expected)


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 40, 100])
def test_the_exact_products_are_summed_in_fp32(rows: int) -> None:
    """fp8(x) times the fp8 codes is exact in fp32; what is left is fp32 summation and the two
    scalings: within 2^-22 of the products' mass of the float64 result. 75 outputs: a partial
    last block and a last tile of one block."""
    gen = torch.Generator().manual_seed(rows)
    qw = quantize_rtn(torch.randn(75, 192, generator=gen), SCHEME.weights)
    bias = torch.randn(75, generator=gen)
    x = torch.randn(rows, 192, generator=gen)
    x[0, 3] = 40.0  # an outlier
    values, x_scale = fp8_reference_round(x)
    scales = x_scale.double() * qw.scale.double().T  # [rows, N]
    w = qw.codes.double()
    exact = (values.double() @ w.T) * scales + bias.double()
    mass = (values.double().abs() @ w.abs().T) * scales + bias.double().abs()
    got = fp8_layer(qw, bias)(x)
    assert bool(((got.double() - exact).abs() <= 2.0 ** -22 * mass).all())
    torch.testing.assert_close(got, Fp8DynamicLinear(qw, bias, torch.float32)(x), rtol=1e-5, atol=1e-5)


def test_a_row_gets_the_bits_it_gets_alone() -> None:
    """Each output is one chain over the inputs in order, decoded as read or widened: a
    request's outputs do not depend on the batch around it (every remainder of a 4-row tile)."""
    gen = torch.Generator().manual_seed(5)
    layer = fp8_layer(quantize_rtn(torch.randn(72, 256, generator=gen), SCHEME.weights), torch.randn(72, generator=gen))
    x = torch.randn(13, 256, generator=gen) * torch.rand(13, 1, generator=gen) * 8
    alone = torch.cat([layer(row[None]) for row in x])
    for rows in range(2, 14):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


@pytest.mark.parametrize("rows", [1, 6])
def test_a_static_scale_clamps_what_lies_past_it(rows: int) -> None:
    """FP8 (static): every row divided by the checkpoint's one input scale, values past 448
    scales clamped, as Fp8DynamicLinear does."""
    gen = torch.Generator().manual_seed(7)
    qw = dataclasses.replace(quantize_rtn(torch.randn(40, 96, generator=gen), SCHEME.weights),
                             input_scale=torch.tensor([0.01]))
    x = torch.randn(rows, 96, generator=gen) * 3
    values, x_scale = fp8_reference_round(x, 0.01)
    assert bool((values.abs() == 448).any())
    exact = (values.double() @ qw.codes.double().T) * x_scale.double() * qw.scale.double().T
    mass = (values.double().abs() @ qw.codes.double().abs().T) * x_scale.double() * qw.scale.double().T
    assert bool(((fp8_layer(qw)(x).double() - exact).abs() <= 2.0 ** -22 * mass).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_holding_a_nan_or_an_inf_gives_nans_and_leaves_the_others(bad: float) -> None:
    """torch's path gives such a row NaN everywhere (its scale, or x / scale, is NaN); the C
    rounding would turn a NaN into 448, so the row's scale carries it."""
    gen = torch.Generator().manual_seed(9)
    qw = quantize_rtn(torch.randn(24, 64, generator=gen), SCHEME.weights)
    layer = fp8_layer(qw)
    x = torch.randn(3, 64, generator=gen)
    clean = layer(x)
    x[1, 10] = bad
    got = layer(x)
    assert bool(got[1].isnan().all()) and bool(Fp8DynamicLinear(qw, None, torch.float32)(x)[1].isnan().all())
    assert torch.equal(got[[0, 2]], clean[[0, 2]])
    assert bool(layer(x[1:2]).isnan().all())
