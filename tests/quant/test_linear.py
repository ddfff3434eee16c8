"""Quantized linear layers against compressed-tensors' dequantization and exact cases."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferlab.kernels import cpu_ops
from inferlab.quant import linear
from inferlab.quant.checkpoint import cat_rows
from inferlab.quant.formats import vnni
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.linear_dynamic import Avx2DynamicLinear, Int8DynamicLinear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import GROUP, INT, ActivationArgs, WeightArgs, make_scheme
from tests.quant.fp8_reference import fp8_reference_round

ct_forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
ct_args = pytest.importorskip("compressed_tensors.quantization")

WEIGHT_ONLY = [("W8A16", 128, False, "Int8WeightOnlyLinear"), ("W8A16", 128, True, "Int8WeightOnlyLinear"),
               ("W4A16", 32, False, "Int4WeightOnlyLinear"), ("W4A16", 64, True, "Int4WeightOnlyLinear")]
# bf16 on a CPU with AVX512-BF16 takes the C kernels of quant_linear.c instead of torch's
BF16_WEIGHT_ONLY = "PackedQuantLinear" if cpu_ops.quant_linear_available() else None
needs_quant_kernels = pytest.mark.skipif(BF16_WEIGHT_ONLY is None, reason="no AVX512-BF16 here")
# fp32 on a CPU with AVX2 + FMA takes avx2_quant_linear.c's (tests/quant/test_avx2_linear.py)
FP32_WEIGHT_ONLY = "Avx2QuantLinear" if cpu_ops.avx2_quant_linear_available() else None


def library_dequantize(qw) -> torch.Tensor:
    """The weight compressed-tensors would reconstruct from these codes and scales."""
    a = qw.args
    args = ct_args.QuantizationArgs(num_bits=a.num_bits, type=a.kind, symmetric=a.symmetric,
                                    strategy=a.strategy, group_size=a.group_size)
    return ct_forward.dequantize(qw.codes, qw.scale.double(), qw.zero_point, args=args).double()


@pytest.mark.parametrize(("name", "group", "asym", "cls"), WEIGHT_ONLY)
# 2 x rows: the register kernel, its groups of 4 rows, AMX tiles (where the CPU has them), the
# dequantizing path
@pytest.mark.parametrize("rows", [1, 3, 20, 64])
def test_weight_only_matches_library_dequantization(name, group, asym, cls, rows) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 128, generator=gen)
    qw = quantize_rtn(w, make_scheme(name, group, asym).weights)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(2, rows, 128, generator=gen)
    expected = x.double() @ library_dequantize(qw).T + bias.double()
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        layer = build_quant_linear(qw, None, bias, dtype)
        assert type(layer).__name__ == ((BF16_WEIGHT_ONLY if dtype == torch.bfloat16 else FP32_WEIGHT_ONLY) or cls)
        out = layer(x.to(dtype))
        assert out.shape == (2, rows, 96) and out.dtype == dtype
        torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())


@pytest.mark.parametrize("rows", [1, 2, 12])
def test_int8_weight_only_in_bf16_reads_rows_of_any_length(rows: int) -> None:
    """Inputs of 200 (not a multiple of 16): torch's int8 kernel gave NaN and 8.5e18 for one
    row, then a segfault for two; shapes the C kernels refuse (K % 32) come here in bf16."""
    gen = torch.Generator().manual_seed(rows)
    qw = quantize_rtn(torch.randn(48, 200, generator=gen), make_scheme("W8A16").weights)
    layer = linear.Int8WeightOnlyLinear(qw, None, torch.bfloat16)
    x = torch.randn(rows, 200, generator=gen)
    expected = x.double() @ library_dequantize(qw).T
    out = layer(x.to(torch.bfloat16)).double()
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


def weight_args(name: str, group: int, asym: bool) -> WeightArgs:
    """make_scheme's weights; "W8A16/g" is int8 in groups of `group` (compressed-tensors' W8A16
    preset has groups of 128), where each 16-output block holds scales of several groups."""
    if name == "W8A16/g":
        return WeightArgs(8, INT, GROUP, group, not asym)
    return make_scheme(name, group, asym).weights


def held_weight(layer) -> torch.Tensor:
    """(q - zero point) * scale in float64 from a PackedQuantLinear's codes and bf16 scales."""
    unpack = vnni.unpack_uint8_quads if layer.bits == 8 else vnni.unpack_int4
    g = layer.group_size
    zero = 0.0 if layer.zero_point is None else vnni.unpack_block_groups(
        layer.zero_point).double().repeat_interleave(g, 1)
    scale = vnni.unpack_block_groups(layer.scale).double().repeat_interleave(g, 1)
    return (unpack(layer.packed).double() - zero) * scale


def rounded_activations(x: torch.Tensor, block: int, bits: int) -> torch.Tensor:
    """What quant_linear.c specifies for decode rows, in float64: per block of inputs (64, or
    the largest power of two dividing the group), e the exponent of the largest |x|, every x
    rounded (half to even) to a multiple of 2^(e + 1 - bits)."""
    blocks = x.double().reshape(x.shape[0], -1, block)
    step = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(-1, keepdim=True))) + 1 - bits)
    return (torch.round(blocks / step) * step).reshape(x.shape)


def half_bf16_ulp(exact: torch.Tensor) -> torch.Tensor:
    """Half a bf16 ulp of each exact value: as far as one rounding to bf16 may move it."""
    return torch.exp2(torch.floor(torch.log2(exact.abs())) - 8)


def test_rounded_activations_keep_values_near_the_block_maximum() -> None:
    """The rule in hand-checked numbers: block max 3.0 (e = 1, step 2^-13 for 15 bits)."""
    x = torch.tensor([[3.0, 1.5, 2.0 ** -7, 2.0 ** -20, -0.0048828125, 1e-4, 0.0, 0.0]])
    out = rounded_activations(x.to(torch.bfloat16), 8, 15)
    assert out[0, :5].tolist() == [3.0, 1.5, 2.0 ** -7, 0.0, -0.0048828125]  # -5 * 2^-10: exact
    assert out[0, 5].item() == 2.0 ** -13  # 1e-4 (bf16 ~0.0001001) rounds to one step


@needs_quant_kernels
@pytest.mark.parametrize(("name", "group", "asym"), [("W8A16", 128, False), ("W8A16", 128, True),
                                                     ("W8A16/g", 32, False), ("W8A16/g", 64, True),
                                                     ("W4A16", 8, False), ("W4A16", 32, False), ("W4A16", 64, True),
                                                     ("W4A16", 128, False)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 9, 40])
def test_c_decode_kernels_round_the_exact_product_once(name, group, asym, rows) -> None:
    """bf16 decode rows through quant_linear.c: the product of the inputs, rounded as the kernels
    specify (rounded_activations, 14-bit codes), and the weight the layer holds (codes, zero
    points and bf16 scales), rounded to bf16 once. Each group's fp32 sum joins the total in one
    rounding of at most 2^-24 of the product's absolute mass; a zero point's share comes off in
    fp32, a cancellation worth ~1e-7 of sum |x| * scale."""
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(208, 256, generator=gen)  # 13 blocks of 16 outputs: an odd last pair
    qw = quantize_rtn(w, weight_args(name, group, asym))
    layer = build_quant_linear(qw, None, None, torch.bfloat16)
    x = torch.randn(rows, 256, generator=gen).to(torch.bfloat16)
    group = layer.group_size  # W8A16 is per channel whatever the scheme was asked
    inputs = rounded_activations(x, min(64, group & -group), 14)
    exact = inputs @ held_weight(layer).T
    half_ulp = half_bf16_ulp(exact)
    scale_mass = x.double().abs() @ vnni.unpack_block_groups(layer.scale).double().repeat_interleave(
        layer.group_size, 1).T
    group_roundings = 256 // group * 2.0 ** -24 * (inputs.abs() @ held_weight(layer).abs().T)
    slack = half_ulp + 2e-6 * scale_mass + group_roundings
    assert bool(((layer(x).double() - exact).abs() <= slack).all())


@needs_quant_kernels
@pytest.mark.parametrize(("name", "group", "asym"), [("W8A16", 128, False), ("W8A16", 128, True),
                                                     ("W8A16/g", 64, True), ("W4A16", 32, False),
                                                     ("W4A16", 64, True), ("W4A16", 128, False)])
def test_c_decode_rows_get_the_bits_they_get_alone(name, group, asym) -> None:
    """Up to 64 rows (a decode batch) each row's output is the one it gets alone, whichever path
    the count takes (the register kernel, its groups of 4 rows, AMX int8 tiles): a request's
    tokens do not depend on the batch it shares a step with. Rows of different magnitudes, a
    zero block, an odd last block pair, and a bias."""
    gen = torch.Generator().manual_seed(group)
    qw = quantize_rtn(torch.randn(208, 256, generator=gen), weight_args(name, group, asym))
    layer = build_quant_linear(qw, None, torch.randn(208, generator=gen).to(torch.bfloat16), torch.bfloat16)
    x = (torch.randn(64, 256, generator=gen) * torch.rand(64, 1, generator=gen) * 8).to(torch.bfloat16)
    x[3, 64:128] = 0
    alone = torch.cat([layer(row[None]) for row in x])
    for rows in (5, 12, 13, 16, 17, 33, 64):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


@needs_quant_kernels
@pytest.mark.parametrize("name", ["W8A16", "W4A16"])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_c_dequantizing_path_matches_the_held_weight(name: str, scale_dtype: torch.dtype) -> None:
    """More than 64 rows: the weight dequantized to bf16, then the bf16 GEMM. The layer holds
    bf16 scales: a bf16 checkpoint's (what `inferlab quantize` writes for a bf16 model) as they
    are, fp32 ones rounded once."""
    gen = torch.Generator().manual_seed(5)
    qw = quantize_rtn(torch.randn(112, 128, generator=gen), make_scheme(name, 32, True).weights, scale_dtype)
    bias = torch.randn(112, generator=gen).to(torch.bfloat16)  # 7 blocks: an odd last one
    layer = build_quant_linear(qw, None, bias, torch.bfloat16)
    x = torch.randn(80, 128, generator=gen).to(torch.bfloat16)
    weight_bf16 = held_weight(layer).to(torch.bfloat16).double()
    expected = x.double() @ weight_bf16.T + bias.double()
    torch.testing.assert_close(layer(x).double(), expected, rtol=2 ** -8, atol=1e-3)
    torch.testing.assert_close(layer.dequantized_weight().double(), weight_bf16, rtol=0, atol=0)
    stored = dataclasses.replace(qw, scale=qw.scale.to(torch.bfloat16))
    assert torch.equal(stored.scale.to(scale_dtype), qw.scale) == (scale_dtype == torch.bfloat16)
    torch.testing.assert_close(held_weight(layer), library_dequantize(stored), rtol=1e-6, atol=1e-7)


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


def test_int4_kernel_and_dequant_paths_agree() -> None:
    """The two paths sum in different orders: they agree to fp32 rounding of the products' mass
    (a fixed 1e-5 failed about one run in three, unseeded: 1.5e-5 on one of 10,320 outputs)."""
    gen = torch.Generator().manual_seed(0)
    qw = quantize_rtn(torch.randn(80, 256, generator=gen), make_scheme("W4A16", 64).weights)
    layer = build_quant_linear(qw, None, None, torch.float32)
    x = torch.randn(linear.INT4_KERNEL_MAX_ROWS + 1, 256, generator=gen)
    by_kernel = torch.cat([layer(row[None]) for row in x])  # one row at a time: kernel
    mass = x.abs() @ layer.dequantized_weight().abs().T
    assert bool(((layer(x) - by_kernel).abs() <= 2.0 ** -20 * mass).all())  # dequantized GEMM
    torch.testing.assert_close(layer.dequantized_weight(), library_dequantize(qw).float(),
                               rtol=1e-6, atol=1e-6)


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


@pytest.mark.parametrize(("name", "group", "limit"), [("W8A16", 128, 0.55), ("W8A8", 128, 0.55),
                                                      ("FP8_DYNAMIC", 128, 0.55), ("W4A16", 128, 0.35)])
def test_resident_bytes_are_compressed(name: str, group: int, limit: float) -> None:
    scheme = make_scheme(name, group)
    layer = build_quant_linear(quantize_rtn(torch.randn(512, 1024), scheme.weights),
                               scheme.activations, None, torch.bfloat16)
    assert layer.resident_bytes() <= limit * 512 * 1024 * 2  # bf16 bytes of the same weight


@pytest.mark.parametrize(("name", "group", "asym"), [("W4A16", 32, True), ("W8A16", 128, False),
                                                     ("W8A8", 128, False)])
def test_fused_shards_equal_the_separate_layers(name: str, group: int, asym: bool) -> None:
    scheme = make_scheme(name, group, asym)
    gen = torch.Generator().manual_seed(3)
    shards = [quantize_rtn(torch.randn(n, 64, generator=gen) * (i + 1), scheme.weights)
              for i, n in enumerate((64, 32, 32))]  # q, k, v with different ranges
    fused = build_quant_linear(cat_rows(shards, "qkv_proj"), scheme.activations, None, torch.float32)
    x = torch.randn(5, 64, generator=gen)
    separate = torch.cat([build_quant_linear(s, scheme.activations, None, torch.float32)(x)
                          for s in shards], dim=1)
    torch.testing.assert_close(fused(x), separate, rtol=1e-6, atol=1e-6)


def test_gpu_int4_layer_through_the_triton_interpreter() -> None:
    pytest.importorskip("triton")
    from inferlab.quant.linear import PackedInt4Linear

    qw = quantize_rtn(torch.randn(48, 64), make_scheme("W4A16", 32, asymmetric=True).weights)
    layer = PackedInt4Linear(qw, None, torch.float32)  # what a CUDA device gets, run on CPU
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x).double(), x.double() @ library_dequantize(qw).T,
                               rtol=1e-5, atol=1e-5)


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
