"""Quantized linear layers whose activations are quantized too (W8A8, FP8_DYNAMIC): the C
kernels against the exact integer or fp8 product rounded once, exact cases, and which int8
product the torch path keeps."""

from __future__ import annotations

import pytest
import torch

from inferlab.kernels import cpu_ops
from inferlab.quant.formats import vnni
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.linear_dynamic import Avx2DynamicLinear, Int8DynamicLinear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import INT, ActivationArgs, make_scheme
from tests.quant.exact import half_bf16_ulp
from tests.quant.fp8_reference import fp8_reference_round


@pytest.mark.skipif(not cpu_ops.dynamic_linear_available(), reason="no AVX512-VNNI kernels here")
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 40, 100])  # 4-row kernel; int8 GEMM tiles above
def test_c_w8a8_is_the_exact_integer_product_rounded_once(rows: int) -> None:
    """x quantized per token as dynamic_linear.c specifies (scale = absmax / 127, codes rounded
    half to even from x * (1 / scale)), int32 sums, scaled and rounded to bf16 once."""
    gen = torch.Generator().manual_seed(rows)
    scheme = make_scheme("W8A8")
    qw = quantize_rtn(torch.randn(208, 192, generator=gen), scheme.weights)
    bias = torch.randn(208, generator=gen).to(torch.bfloat16)
    layer = build_quant_linear(qw, scheme.activations, bias, torch.bfloat16)
    assert type(layer).__name__ == "PackedW8A8Linear"
    x = torch.randn(rows, 192, generator=gen).to(torch.bfloat16)
    x[0, 3] = 40.0  # an outlier row
    x_scale = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    codes = torch.round(x.float() * (1 / x_scale))
    assert codes.abs().max() <= 127
    exact = (codes.double() @ qw.codes.double().T) * x_scale.double() * layer.scale.double() \
        + bias.double()
    half_ulp = half_bf16_ulp(exact)
    assert bool(((layer(x).double() - exact).abs() <= half_ulp * 1.001).all())  # fp32 scaling


@pytest.mark.skipif(not cpu_ops.dynamic_linear_available(), reason="no AVX512-VNNI kernels here")
@pytest.mark.parametrize("rows", [1, 5, 40])  # 4-row kernel; int8 GEMM tiles above
def test_c_w8a8_with_a_static_scale_clamps_the_codes_it_exceeds(rows: int) -> None:
    """A checkpoint's input_scale quantizes every row with it: codes round half to even from
    x * (1 / scale) and saturate to [-128, 127] where |x| outruns 127 scales."""
    gen = torch.Generator().manual_seed(100 + rows)
    scheme = make_scheme("W8A8")
    qw = quantize_rtn(torch.randn(208, 192, generator=gen), scheme.weights)
    qw.input_scale = torch.tensor([0.01])
    layer = build_quant_linear(qw, ActivationArgs(INT, static=True), None, torch.bfloat16)
    assert type(layer).__name__ == "PackedW8A8Linear"
    x = torch.randn(rows, 192, generator=gen).to(torch.bfloat16)  # |x| past 1.27: saturated
    codes = torch.round(x.float() * (1 / torch.tensor(0.01))).clamp(-128, 127)
    assert (codes == 127).any() and (codes == -128).any()
    exact = (codes.double() @ qw.codes.double().T) * 0.01 * layer.scale.double()
    half_ulp = half_bf16_ulp(exact)
    assert bool(((layer(x).double() - exact).abs() <= half_ulp * 1.001).all())


needs_fp8_kernels = pytest.mark.skipif(not cpu_ops.dynamic_linear_available(),
                                       reason="no AVX512-BF16 kernels here")


@needs_fp8_kernels
@pytest.mark.parametrize("rows", [1, 3, 5, 33])  # the kernel up to 4 rows, AMX tiles above
def test_c_fp8_rounds_activations_as_torch_does(rows: int) -> None:
    """Through an identity weight (codes 1.0, scale 1) the layer returns each token's fp8
    rounding times its scale: the same bits as torch's float8_e4m3fn conversion, subnormals,
    ties and the +-448 clamp included."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=gen) * torch.exp2(torch.randint(-14, 3, (rows, 64), generator=gen))
    x[:, 5] = 3.0  # absmax: scale 3 / 448
    x[0, 6] = 3.0 / 448 * 0.5 * 2.0 ** -9 * 3  # 1.5 x the smallest subnormal step: a tie
    x = x.to(torch.bfloat16)
    scheme = make_scheme("FP8_DYNAMIC")
    eye = torch.eye(64).to(torch.float8_e4m3fn)
    qw = quantize_rtn(torch.eye(64), scheme.weights)
    qw = type(qw)(eye, torch.ones(64, 1), None, qw.args)
    layer = build_quant_linear(qw, scheme.activations, None, torch.bfloat16)
    assert type(layer).__name__ == "PackedFp8Linear"
    values, x_scale = fp8_reference_round(x)
    assert torch.equal(layer(x), (values * x_scale).to(torch.bfloat16))


@needs_fp8_kernels
def test_c_fp8_decodes_every_code() -> None:
    """One-hot activations read the weight back column by column: every e4m3 code (subnormals,
    negative zero, +-448) must come out as its value, through the kernel (one row at a time)
    and through the AMX path (all rows at once)."""
    byte = (torch.arange(256)[:, None] + 7 * torch.arange(32)[None, :]) % 256  # [N=256, K=32]
    byte[(byte & 0x7F) == 0x7F] = 0  # e4m3fn's NaNs: never a code
    codes = byte.to(torch.uint8).view(torch.float8_e4m3fn)
    scheme = make_scheme("FP8_DYNAMIC")
    qw = quantize_rtn(torch.ones(256, 32), scheme.weights)
    layer = build_quant_linear(type(qw)(codes, torch.ones(256, 1), None, qw.args),
                               scheme.activations, None, torch.bfloat16)
    expected = codes.float().T.to(torch.bfloat16)  # [K, N]: row k is input k's weights
    one_hot = torch.eye(32, dtype=torch.bfloat16)
    assert torch.equal(layer(one_hot), expected)
    assert torch.equal(torch.cat([layer(row[None]) for row in one_hot]), expected)


@needs_fp8_kernels
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 40, 100])  # the register kernel, AMX decode- and prompt-wise
def test_c_fp8_is_the_exact_product_rounded_once(rows: int) -> None:
    """fp8(x) and the fp8 codes are exact in bf16, their products exact, the sums fp32: the
    result is the exact product, scaled, within half a bf16 ulp (plus fp32 summation)."""
    gen = torch.Generator().manual_seed(rows)
    scheme = make_scheme("FP8_DYNAMIC")
    qw = quantize_rtn(torch.randn(208, 192, generator=gen), scheme.weights)
    bias = torch.randn(208, generator=gen).to(torch.bfloat16)
    layer = build_quant_linear(qw, scheme.activations, bias, torch.bfloat16)
    x = torch.randn(rows, 192, generator=gen).to(torch.bfloat16)
    x[0, 3] = 40.0  # an outlier
    values, x_scale = fp8_reference_round(x)
    scales = x_scale.double() * qw.scale.double().T  # [rows, N]
    w = qw.codes.double()
    exact = (values.double() @ w.T) * scales + bias.double()
    mass = (values.double().abs() @ w.abs().T) * scales
    half_ulp = half_bf16_ulp(exact)
    assert bool(((layer(x).double() - exact).abs() <= half_ulp * 1.001 + 2.0 ** -22 * mass).all())
    assert torch.equal(vnni.unpack_int8(layer.packed).view(torch.float8_e4m3fn), qw.codes)


def test_w8a8_is_exact_when_activations_are_integer_codes() -> None:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(-126, 127, (4, 64), generator=gen).float()
    codes[:, 7] = 127.0  # each row's absmax is the top code, so per-token quantization is lossless
    x = codes * torch.tensor([[0.5], [0.25], [2.0], [1.0]])  # power-of-two row scales
    w = torch.randint(-127, 128, (32, 64), generator=gen).float() * 2.0 ** -6
    w[:, 0] = 127 * 2.0 ** -6  # per-channel scale 2^-6 exactly
    qw = quantize_rtn(w, make_scheme("W8A8").weights)
    activations = make_scheme("W8A8").activations
    layer = build_quant_linear(qw, activations, None, torch.float32)
    on_avx2 = Avx2DynamicLinear.fits(qw, activations, torch.float32, torch.device("cpu"))
    assert type(layer) is (Avx2DynamicLinear if on_avx2 else Int8DynamicLinear)
    for each in (layer, Int8DynamicLinear(qw, None, torch.float32)):  # the int8 GEMM's too
        torch.testing.assert_close(each(x), x @ w.T, rtol=0, atol=0)


def test_fp8_dynamic_is_exact_on_fp8_representable_values() -> None:
    gen = torch.Generator().manual_seed(1)
    values = torch.tensor([-448.0, -96.0, -3.5, -0.5, 0.0, 0.25, 1.0, 13.0, 240.0, 448.0])
    x = values[torch.randint(0, 10, (5, 48), generator=gen)]
    x[:, 0] = 448.0  # absmax 448: activation scale exactly 1
    w = values[torch.randint(0, 10, (16, 48), generator=gen)] / 448.0 * 4.0
    w[:, 1] = 4.0  # weight scale 4 / 448 maps w back onto the same fp8 values
    scheme = make_scheme("FP8_DYNAMIC")
    layer = build_quant_linear(quantize_rtn(w, scheme.weights), scheme.activations, None, torch.float32)
    torch.testing.assert_close(layer(x), x @ w.T, rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("name", ["W8A8", "FP8_DYNAMIC"])
def test_dynamic_activation_error_is_small_on_random_data(name: str) -> None:
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(33, 128, generator=gen), torch.randn(40, 128, generator=gen)
    scheme = make_scheme(name)
    layer = build_quant_linear(quantize_rtn(w, scheme.weights), scheme.activations, None, torch.bfloat16)
    ref = x @ w.T
    rel = ((layer(x.bfloat16()).float() - ref).norm() / ref.norm()).item()
    assert rel < (0.02 if name == "W8A8" else 0.06)


def _exact_int8(x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    return x.double().mm(w.double().t()).float()


def _one_off_int8(x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    out = _exact_int8(x, w)
    out[3, 5] += 1
    return out


@pytest.mark.parametrize("onednn_s, int_mm_s, product, used", [
    (0.002, 0.001, _exact_int8, True), (0.5, 0.001, _exact_int8, False),
    (0.001, 0.001, _one_off_int8, False)])
def test_onednn_int8_is_used_if_exact_and_not_far_slower_than_int_mm(monkeypatch, onednn_s, int_mm_s,
                                                                     product, used):
    """oneDNN's reference int8 path (an AMD EPYC Zen 4: 3.2 s for a product torch._int_mm did in
    0.93 ms) made W8A8 calibration run for hours: the faster kernel within 4x is kept. Its
    kernel for CPUs without VNNI (AMD EPYC Zen 3) saturates 16-bit pair sums: one product off
    by one is enough to refuse it."""
    from inferlab.quant import linear_dynamic

    if not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        pytest.skip("this torch has no oneDNN int8 linear")
    monkeypatch.setattr(linear_dynamic, "_onednn_int8", product)
    monkeypatch.setattr(linear_dynamic, "_onednn_int8_seconds", lambda: onednn_s)
    monkeypatch.setattr(linear_dynamic, "_int_mm_seconds", lambda: int_mm_s)
    linear_dynamic.onednn_int8_available.cache_clear()
    try:
        assert linear_dynamic.onednn_int8_available() is used
    finally:
        linear_dynamic.onednn_int8_available.cache_clear()
