"""Weight-only quantized linear layers (W8A16, W4A16) against compressed-tensors' dequantization
and exact cases; the resident bytes and fused shards of every scheme (the activation-quantized
schemes' kernels: test_dynamic_linear.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferlab.kernels import cpu_ops
from inferlab.quant import linear
from inferlab.quant.checkpoint import cat_rows
from inferlab.quant.formats import vnni
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import GROUP, INT, WeightArgs, make_scheme
from tests.quant.exact import half_bf16_ulp

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
