"""Quantized linear layers whose activations are quantized too, at each call.

* W8A8 (int8 weights, int8 activations per token), bf16 on a CPU with AVX512-VNNI: the C
  kernels of inferlab/kernels/cpu/dynamic_linear.c (PackedW8A8Linear), which quantize x in C and
  multiply with vpdpbusd up to 4 rows, AMX int8 tiles above. Elsewhere an int8 GEMM at every
  size (oneDNN's, see Int8DynamicLinear), the activations quantized with in-place ops, because
  fresh allocations (page faults) cost more than the arithmetic on this machine. fp32 on a CPU
  with AVX2 where that GEMM is inexact (no VNNI): avx2_dynamic_linear.c, exact int32 sums with
  vpmaddwd (Avx2DynamicLinear).
* FP8_DYNAMIC: this CPU has no fp8 arithmetic (`torch._scaled_mm` measured at ~0.02x bf16), but
  e4m3 values are exact in bf16. bf16 models on a CPU with AVX512-BF16 take the C kernels of
  inferlab/kernels/cpu/dynamic_linear.c (PackedFp8Linear): x rounded to fp8 per token in C, the
  codes widened in registers for `vdpbf16ps` up to 4 rows, a chunk at a time into each thread's
  L2 for AMX tiles above.
  fp32 models on a CPU with AVX2: avx2_dynamic_linear.c (Avx2DynamicLinear), x rounded to fp8 in
  C, the codes widened in registers, the exact products summed in fp32. Elsewhere torch rounds x
  and both operands go through `F.linear`, the fp8 weight widened per call, never kept wide
  (Fp8DynamicLinear).
* Static activations (FP8, or a W8A8 checkpoint with `input_scale`s) take the same layers with
  the one calibrated scale in place of each row's; values past it clamp, as in vLLM.
* FP8_BLOCK (weights in blocks, activations in groups of a row): GroupDynamicLinear, torch
  arithmetic with the weight widened per call.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F

from inferlab.kernels import avx2_blocks, cpu_library, cpu_ops, scaled_mm
from inferlab.kernels.avx2_fp32_linear import KeptAvx2Desc
from inferlab.kernels.host_memory import in_huge_pages
from inferlab.kernels.scaled_mm import FP8_MAX, INT8_MAX
from inferlab.quant.formats import vnni
from inferlab.quant.linear import CKernelLinear, DequantLinear, QuantLinear
from inferlab.quant.qparams import QuantizedWeight
from inferlab.quant.scheme import INT, ActivationArgs
from inferlab.timing import best_seconds


class Int8DynamicLinear(QuantLinear):
    """W8A8: int8 weights per channel, activations quantized per token at run time, int8 GEMM.

    On x86 the GEMM is oneDNN's int8 linear (`onednn.qlinear_pointwise`, the kernel Inductor uses
    for int8) where it has a kernel for the CPU (onednn_int8_available): on an Intel Xeon, 1.1 ms
    vs 2.7 ms for `torch._int_mm` and 2.2 ms for bf16 on a 512x576 @ 576x3072 product; it also
    applies the per-channel weight scales and writes bf16, leaving only the per-token scale.
    `torch._int_mm` elsewhere.
    """

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("scale", qw.scale.reshape(n).float())  # fp32 [N]
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None
        codes = qw.codes.contiguous()  # int8 [N, K]
        self.onednn = codes.device.type == "cpu" and onednn_int8_available()
        if self.onednn:  # oneDNN's blocked int8 layout, same bytes
            self.register_buffer("qweight", torch.ops.onednn.qlinear_prepack(codes, [1, k]))
            self.register_buffer("zero_points", torch.zeros(n, dtype=torch.int64), persistent=False)
        else:
            self.register_buffer("qweight", codes)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return scaled_mm.int8_w8a8_linear(x, self.qweight, self.scale, input_scale=self.input_scale)
        xq, x_scale = _int8_codes(x, self.input_scale)  # fp32 [M, K], [M, 1]
        xq = xq.to(torch.int8)
        if self.onednn:
            out_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
            y = torch.ops.onednn.qlinear_pointwise(  # sum_k xq*q * scale[n]: [M, N]
                xq, 1.0, 0, self.qweight, self.scale, self.zero_points, None, 1.0, 0, out_dtype,
                "none", [], "")
            return y.mul_(x_scale.to(out_dtype)).to(self.dtype)
        acc = torch._int_mm(xq, self.qweight.t())  # int32 [M, N], exact
        return acc.to(torch.float32).mul_(x_scale).mul_(self.scale).to(self.dtype)


def _int8_codes(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> its int8 codes as fp32 [M, K] and the per-token (or static) scale [M, 1],
    with in-place ops (fresh allocations fault pages in)."""
    x_scale = scaled_mm.activation_scale(x, INT8_MAX, input_scale)  # [M, 1]
    xq = x.to(torch.float32, copy=True).div_(x_scale).round_()  # [M, K]
    if input_scale is not None:  # |x| / (absmax / 127) <= 127 only for dynamic scales
        xq.clamp_(-INT8_MAX - 1, INT8_MAX)
    return xq, x_scale


class Avx2DynamicLinear(KeptAvx2Desc, QuantLinear):
    """W8A8, FP8_DYNAMIC and FP8 for fp32 on a CPU with AVX2 (avx2_dynamic_linear.c), x quantized
    per token (or with the static scale) in C at any row count.

    W8A8 where no int8 GEMM is both exact and fast (oneDNN's saturates 16-bit sums without VNNI,
    see onednn_int8_available; torch._int_mm took 4.4 s for the embedded model's 64-token prefill
    on an AMD EPYC Zen 3, against 0.3 s in fp32): x quantized as Int8DynamicLinear does, the int8
    products summed exactly with vpmaddwd: Int8DynamicLinear's bits on torch._int_mm.
    FP8: x rounded as Fp8DynamicLinear does, the exact products of the fp8 values summed in fp32
    (Fp8DynamicLinear widened the whole weight to fp32 in every call)."""

    bias_in_matmul = True
    kernel_max_rows = sys.maxsize  # the kernel takes every row count

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.fp8 = qw.codes.dtype == torch.float8_e4m3fn
        packed = (avx2_blocks.pack_codes(qw.codes.view(torch.int8), 8) if self.fp8  # uint8 [N/8, K, 8]
                  else avx2_blocks.pack_pairs(qw.codes))  # int8 [N/8, K/2, 8, 2]
        self.register_buffer("packed", in_huge_pages(packed))
        self.register_buffer("scale", F.pad(qw.scale.reshape(n).float(), (0, -n % 8)))  # fp32 [N/8 * 8]
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None

    @staticmethod
    def fits(qw: QuantizedWeight, activations: ActivationArgs, dtype: torch.dtype,
             device: torch.device) -> bool:
        n, k = qw.shape
        if not (device.type == "cpu" and dtype == torch.float32 and k % 8 == 0 and qw.scale.numel() == n
                and qw.zero_point is None and cpu_ops.avx2_quant_linear_available()):
            return False
        if qw.codes.dtype == torch.float8_e4m3fn:
            return activations.kind != INT
        return (activations.kind == INT and qw.args.kind == INT and qw.args.num_bits == 8
                and not onednn_int8_available())

    def c_desc(self) -> cpu_library.Avx2QuantDesc:
        return cpu_library.Avx2QuantDesc(
            n_out=self.out_features, k_in=self.in_features, group=self.in_features, bits=8,
            codes=self.packed.data_ptr(), scale=self.scale.data_ptr(), offset=None,
            bias=cpu_library.tensor_ptr(self.bias), act_bits=8,
            input_scale=cpu_library.tensor_ptr(self.input_scale), fp8=int(self.fp8))

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_ops.avx2_quant_linear(x, self._kept_desc())  # [M, N]


ONEDNN_SLOWER_LIMIT = 4.0  # oneDNN's int8 linear is used unless this many times torch._int_mm's time


@functools.cache
def onednn_int8_available() -> bool:
    """Whether this torch has oneDNN's int8 linear, it computes a full-range product exactly, and
    it is not far slower than torch._int_mm here. oneDNN takes its reference path on CPUs it has
    no int8 kernel for: on an AMD EPYC (Zen 4, AVX512-VNNI) a 512x576 @ 576x960 product took
    3.2 s against 0.93 ms for torch._int_mm, and a W8A8 SmoothQuant run of the embedded model
    ran past 10 minutes (W8A8 RTN: 11 s). On a CPU without VNNI (AMD EPYC Zen 3, AVX2) its
    kernel multiplies byte pairs into saturating 16-bit sums: exact for small codes, off by up to
    1.1e5 of sums near 2e6 on the probe's full-range ones."""
    if not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    try:
        x, w = _probe_operands()
        exact = torch.equal(_onednn_int8(x, w), x.double().mm(w.double().t()).float())
        return exact and _onednn_int8_seconds() <= ONEDNN_SLOWER_LIMIT * _int_mm_seconds()
    except RuntimeError:
        return False


def _onednn_int8(x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x int8 [M, K] @ w int8 [N, K]^T through oneDNN, fp32 [M, N]."""
    n, k = w.shape
    packed = torch.ops.onednn.qlinear_prepack(w, [1, k]) if packed is None else packed
    return torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, torch.ones(n),
                                              torch.zeros(n, dtype=torch.int64), None, 1.0, 0,
                                              torch.float32, "none", [], "")


# M, K, N: ~0.1 ms on torch._int_mm, ~0.1 s on oneDNN's slow path; sums below 2^24, exact in fp32
_PROBE_SHAPE = (32, 512, 512)


def _probe_operands() -> tuple[torch.Tensor, torch.Tensor]:
    m, k, n = _PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    return (torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen),
            torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen))


def _onednn_int8_seconds() -> float:
    x, w = _probe_operands()
    packed = torch.ops.onednn.qlinear_prepack(w, [1, w.shape[1]])
    return best_seconds(lambda: _onednn_int8(x, w, packed), 2)


def _int_mm_seconds() -> float:
    x, w = _probe_operands()
    wt = w.t()
    return best_seconds(lambda: torch._int_mm(x, wt), 2)


class PackedW8A8Linear(CKernelLinear):
    """W8A8 for bf16 on CPU through dynamic_linear.c: int8 codes in quads [N/16, K/4, 16, 4], fp32
    per-channel scales; each call quantizes x per token in C, then vpdpbusd (up to 4 rows) or
    AMX int8 tiles (more), exact int32 sums scaled and rounded to bf16 once."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("packed", in_huge_pages(vnni.pack_int8(qw.codes, inputs=4)))
        self.register_buffer("scale", qw.scale.reshape(n).float().contiguous())
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None
        self.register_buffer("weight_sums", qw.codes.sum(dim=1, dtype=torch.int32).contiguous())

    @staticmethod
    def fits(qw: QuantizedWeight, activations: ActivationArgs, dtype: torch.dtype,
             device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.bfloat16 and activations.kind == INT
                and qw.args.num_bits == 8 and qw.zero_point is None and qw.scale.numel() == n
                and n % 16 == 0 and k % 64 == 0 and cpu_ops.dynamic_linear_available())

    def c_desc(self) -> cpu_library.LinearDesc:
        return cpu_library.LinearDesc(
            kind=cpu_library.LINEAR_W8A8, n_out=self.out_features, k_in=self.in_features,
            weight=self.packed.data_ptr(), scale=self.scale.data_ptr(),
            bias=cpu_library.tensor_ptr(self.bias),
            weight_sums=self.weight_sums.data_ptr(), input_scale=cpu_library.tensor_ptr(self.input_scale))


class PackedFp8Linear(CKernelLinear):
    """FP8_DYNAMIC for bf16 on CPU through dynamic_linear.c: e4m3 codes in the bf16 kernels' pair
    layout [N/16, K/2, 16, 2] (one byte each), fp32 per-channel scales; each call rounds x to
    fp8 per token in C, and the exact products are summed in fp32 (vdpbf16ps up to 4 rows, AMX
    bf16 tiles above), scaled and rounded to bf16 once."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("packed", in_huge_pages(vnni.pack_int8(qw.codes.view(torch.uint8), inputs=2)))
        self.register_buffer("scale", qw.scale.reshape(n).float().contiguous())
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None

    @staticmethod
    def fits(qw: QuantizedWeight, activations: ActivationArgs, dtype: torch.dtype,
             device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.bfloat16 and activations.kind != INT
                and qw.codes.dtype == torch.float8_e4m3fn and qw.scale.numel() == n
                and cpu_ops.dynamic_linear_available() and cpu_ops.bf16_linear_fits(n, k))

    def c_desc(self) -> cpu_library.LinearDesc:
        return cpu_library.LinearDesc(
            kind=cpu_library.LINEAR_FP8, n_out=self.out_features, k_in=self.in_features,
            weight=self.packed.data_ptr(), scale=self.scale.data_ptr(),
            bias=cpu_library.tensor_ptr(self.bias),
            input_scale=cpu_library.tensor_ptr(self.input_scale))


class Fp8DynamicLinear(QuantLinear):
    """FP8_DYNAMIC and FP8: fp8 e4m3 weights per channel (or tensor), activations rounded to fp8
    per token (or with the static scale)."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("qweight", qw.codes.contiguous())  # float8_e4m3fn [N, K]
        self.register_buffer("scale", qw.scale.reshape(n).float())  # fp32 [N]
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return scaled_mm.fp8_w8a8_linear(x, self.qweight, self.scale, input_scale=self.input_scale)
        x_scale = scaled_mm.activation_scale(x, FP8_MAX, self.input_scale)  # [M, 1]
        xq = x.to(torch.float32, copy=True).div_(x_scale).clamp_(-FP8_MAX, FP8_MAX)
        # fp8 values are exact in bf16 and fp32; bf16 runs the fast GEMM, fp32 models stay exact
        mm_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
        xq = xq.to(torch.float8_e4m3fn).to(mm_dtype)
        y = F.linear(xq, self.qweight.to(mm_dtype)).float()  # [M, N], fp32 accumulation inside
        return y.mul_(x_scale).mul_(self.scale).to(self.dtype)


class GroupDynamicLinear(DequantLinear):
    """FP8_BLOCK (or any int8/fp8 weights in groups or blocks) with activations quantized per
    group of each row's inputs, the group as wide as the weight's: y = sum over groups g of
    (x_q[:, g] . w_q[:, g]) * x_scale[:, g] * w_scale[:, g], computed as compressed-tensors
    computes it, both sides rounded to their codes and scaled back, then one GEMM. No kernel
    here multiplies the codes: the weight is widened per call (never kept wide), so this is
    correct but slow; FP8_BLOCK is a GPU format (DeepSeek-V3's)."""

    def __init__(self, qw: QuantizedWeight, activations: ActivationArgs, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        super().__init__(qw, bias, dtype)
        self.activations = activations

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        groups = x.reshape(-1, self.activations.group_size)  # [M*G, size]: a group quantizes as a row does
        quantize = scaled_mm.quantize_rows_int8 if self.activations.kind == INT else scaled_mm.quantize_rows_fp8
        xq, x_scale = quantize(groups)  # [M*G, size], [M*G, 1]
        return F.linear((xq.float() * x_scale).view(m, k).to(self.dtype), self.dequantized_weight())


def _input_scale(qw: QuantizedWeight) -> torch.Tensor | None:
    return None if qw.input_scale is None else qw.input_scale.reshape(1).float().contiguous()


def build_dynamic_linear(qw: QuantizedWeight, activations: ActivationArgs, bias: torch.Tensor | None,
                         dtype: torch.dtype, device: torch.device) -> QuantLinear:
    """The fastest layer for this weight and its activations (tensors already on `device`)."""
    if activations.group_size is not None:
        return GroupDynamicLinear(qw, activations, bias, dtype)
    if PackedW8A8Linear.fits(qw, activations, dtype, device):
        return PackedW8A8Linear(qw, bias, dtype)
    if PackedFp8Linear.fits(qw, activations, dtype, device):
        return PackedFp8Linear(qw, bias, dtype)
    if Avx2DynamicLinear.fits(qw, activations, dtype, device):
        return Avx2DynamicLinear(qw, bias, dtype)
    cls = Int8DynamicLinear if activations.kind == INT else Fp8DynamicLinear
    return cls(qw, bias, dtype)
