"""Quantized linear layers: weights resident at their compressed size, a kernel chosen per call.

Every layer keeps only its compressed weight (int8, packed int4 or fp8 codes plus small scales)
and picks its arithmetic by the number of rows in the call:

* weight-only int8/int4 (W8A16, W4A16), bf16 on a CPU with AVX512-BF16: the C kernels of
  inferlab/kernels/cpu/quant_linear.c, in their own layouts (PackedQuantLinear). Up to 4 rows
  the codes load as `vpdpbusd`'s unsigned operand against 14-bit activation codes, so a decode
  step reads a half or a quarter of bf16's bytes; more rows dequantize the weight to bf16 once
  per call and take the AMX GEMM, which a prefill is bound by the arithmetic of.
* weight-only elsewhere (fp32 models, CPUs without AVX512-BF16): torch's CPU kernels
  (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`). They read few bytes but do not tile
  well; measured on this 2-core AMX CPU with `benchmarks/quant_speed.py --layer-sweep`
  (SmolLM2-135M's four linear shapes, bf16, best of 20; speed as a multiple of bf16
  `F.linear`):

  | rows | int8 kernel | int8 dequant+GEMM | int4 kernel | int4 dequant+GEMM |
  |------|-------------|-------------------|-------------|-------------------|
  | 1    | 2.9-3.1     | 0.45-0.51         | 2.9-3.4     | 0.08-0.09         |
  | 8    | 0.57-1.01   | 0.35-0.51         | 0.69-1.13   | 0.06-0.08         |
  | 16   | 0.30-0.55   | 0.39-0.46         | 0.36-0.62   | 0.06-0.08         |
  | 128  | 0.13-0.19   | 0.57-0.64         | 0.16-0.20   | 0.16-0.20         |
  | 512  | 0.10-0.14   | 0.73-0.81         | 0.13-0.15   | 0.35-0.42         |

  Dequantizing costs a fixed few passes over the weight (unpacking torch's blocked int4 layout
  is the dearest), then the GEMM runs at full speed; the kernels' cost grows with the rows.
  Hence the crossovers below: int8 near 12 rows, int4 near 128.
* W8A8 (int8 weights, int8 activations per token), bf16 on a CPU with AVX512-VNNI: the C
  kernels of inferlab/kernels/cpu/dynamic_linear.c (PackedW8A8Linear), which quantize x in C and
  multiply with vpdpbusd up to 4 rows, AMX int8 tiles above. Elsewhere an int8 GEMM at every
  size (oneDNN's, see Int8DynamicLinear), the activations quantized with in-place ops, because
  fresh allocations (page faults) cost more than the arithmetic on this machine.
* FP8_DYNAMIC: this CPU has no fp8 arithmetic (`torch._scaled_mm` measured at ~0.02x bf16), but
  e4m3 values are exact in bf16. bf16 models on a CPU with AVX512-BF16 take the C kernels of
  inferlab/kernels/cpu/dynamic_linear.c (PackedFp8Linear): x rounded to fp8 per token in C, the
  codes widened in registers for `vdpbf16ps` up to 4 rows, once per call for AMX tiles above.
  Elsewhere (fp32 models) torch rounds x and both operands go through `F.linear`, the fp8 weight
  widened per call, never kept wide (Fp8DynamicLinear).
* Static activations (FP8, or a W8A8 checkpoint with `input_scale`s) take the same layers with
  the one calibrated scale in place of each row's; values past it clamp, as in vLLM.
* FP8_BLOCK (weights in blocks, activations in groups of a row): GroupDynamicLinear, torch
  arithmetic with the weight widened per call.
"""

from __future__ import annotations

import abc
import functools

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.kernels import cpu_ops, scaled_mm
from inferlab.quant.formats import int4_cpu, vnni
from inferlab.quant.formats.int_pack import pack_int32
from inferlab.quant.qparams import FP8_MAX, QuantizedWeight
from inferlab.quant.scheme import GROUPED, INT, ActivationArgs

# Largest row count that takes the weight-only kernels (the table in the module docstring).
INT8_KERNEL_MAX_ROWS = 12
INT4_KERNEL_MAX_ROWS = 128
INT8_MAX = 127.0


class QuantLinear(nn.Module, abc.ABC):
    """y = x W^T + b over [..., in_features]; subclasses implement `_matmul` on [M, K] rows."""

    bias_in_matmul = False  # True where `_matmul` adds the bias itself

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.dtype).contiguous()  # [M, K]
        y = self._matmul(x2)  # [M, N]
        if self.bias is not None and not self.bias_in_matmul:
            y = y + self.bias
        return y.reshape(*lead, self.out_features).to(x.dtype)

    @abc.abstractmethod
    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] in self.dtype -> [M, N]."""

    def resident_bytes(self) -> int:
        """Bytes this layer keeps in memory (weights, scales, bias)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int8WeightOnlyLinear(QuantLinear):
    """W8A16 per output channel: int8 codes [N, K], scale [N], optional zero point."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("qweight", qw.codes.contiguous())  # int8 [N, K]
        scale = qw.scale.reshape(n).float()
        self.asymmetric = qw.zero_point is not None
        # asymmetric: y = x (q s)^T - sum(x) (zp s); computed in fp32 so the subtraction is exact enough
        self.register_buffer("scale", scale.to(torch.float32 if self.asymmetric else dtype))
        zero_scale = None if qw.zero_point is None else qw.zero_point.reshape(n).float() * scale
        self.register_buffer("zero_scale", zero_scale)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.float() if self.asymmetric else x
        if x.shape[0] <= INT8_KERNEL_MAX_ROWS and x.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(xs, self.qweight, self.scale)  # [M, N]
        else:
            y = F.linear(xs, self.qweight.to(xs.dtype)).mul_(self.scale)
        if self.asymmetric:
            y = y - xs.sum(dim=-1, keepdim=True) * self.zero_scale
        return y.to(self.dtype)


class Int4WeightOnlyLinear(QuantLinear):
    """W4A16 in torch's CPU int4 layout: packed nibbles [N, K/2] and scales+zeros [K/G, N, 2].

    The kernel computes w = (u - 8) * scale + zero from unsigned nibbles u = q + 8, so
    compressed-tensors' (q - zp) * scale becomes zero = -zp * scale.
    """

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.group_size = kernel_group_size(qw)
        scale = qw.scale.float().repeat_interleave(_group_of(qw) // self.group_size, dim=1)  # [N, K/g]
        zp = torch.zeros_like(scale) if qw.zero_point is None else qw.zero_point.float().repeat_interleave(
            _group_of(qw) // self.group_size, dim=1)
        scales_and_zeros = torch.stack([scale, -zp * scale], dim=-1).transpose(0, 1)  # [K/g, N, 2]
        self.register_buffer("packed", int4_cpu.to_int4pack(qw.codes))  # uint8 [N, K/2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(dtype).contiguous())
        self.can_unpack = int4_cpu.layout_is_known()

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= INT4_KERNEL_MAX_ROWS or not self.can_unpack:
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, self.packed, self.group_size, self.scales_and_zeros)
        return F.linear(x, self.dequantized_weight())

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] in the compute dtype, from the packed nibbles: u * scale + (zero - 8 * scale)."""
        n, k, g = self.out_features, self.in_features, self.group_size
        u = int4_cpu.unpack_nibbles(self.packed, n, k).view(n, k // g, g).to(self.dtype)
        scale = self.scales_and_zeros[..., 0].t().unsqueeze(-1)  # [N, K/g, 1]
        offset = (self.scales_and_zeros[..., 1] - 8 * self.scales_and_zeros[..., 0]).t().unsqueeze(-1)
        return u.mul_(scale).add_(offset).view(n, k)


class CKernelLinear(QuantLinear, abc.ABC):
    """A layer the C kernels run through linear_forward (also inside the decode path's one
    call, see inferlab/kernels/cpu_decode.py); the bias is added inside, before the one rounding
    to bf16."""

    bias_in_matmul = True

    @abc.abstractmethod
    def c_desc(self) -> cpu_ops.LinearDesc:
        """The layer for the C kernels (pointers into this module's buffers)."""

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_ops.linear_forward(x, self.c_desc())


class PackedQuantLinear(CKernelLinear):
    """W8A16 or W4A16 for bf16 on CPU, in quant_linear.c's layouts (inferlab.quant.formats.vnni):
    codes, bf16 scales [K/G, N], bf16 zero points [K/G, N] when asymmetric. Scales in the
    compute dtype, as vLLM's weight-only kernels take them: a bf16 checkpoint's pass unchanged,
    fp32 ones round once (2^-9 relative at most); zero points are integers, exact in bf16."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.bits, self.group_size = qw.args.num_bits, _group_of(qw)
        pack = vnni.pack_uint8_quads if self.bits == 8 else vnni.pack_int4
        self.register_buffer("packed", pack(qw.codes))
        self.register_buffer("scale", qw.scale.to(torch.bfloat16).t().contiguous())  # [K/G, N]
        zero = None if qw.zero_point is None else qw.zero_point.to(torch.bfloat16).t().contiguous()
        self.register_buffer("zero_point", zero)  # [K/G, N] or None

    @staticmethod
    def fits(qw: QuantizedWeight, dtype: torch.dtype, device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.bfloat16 and qw.args.kind == INT
                and qw.args.num_bits in (4, 8) and cpu_ops.quant_linear_available()
                and cpu_ops.bf16_linear_fits(n, k) and _group_of(qw) % 8 == 0)

    def c_desc(self) -> cpu_ops.LinearDesc:
        kind = cpu_ops.LINEAR_INT8 if self.bits == 8 else cpu_ops.LINEAR_INT4
        return cpu_ops.LinearDesc(
            kind=kind, n_out=self.out_features, k_in=self.in_features, group=self.group_size,
            weight=self.packed.data_ptr(), group_scale=self.scale.data_ptr(),
            group_zero=None if self.zero_point is None else self.zero_point.data_ptr(),
            bias=_ptr(self.bias))

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] in the compute dtype: (q - zero point) * scale per group."""
        unpack = vnni.unpack_uint8_quads if self.bits == 8 else vnni.unpack_int4
        q = unpack(self.packed).float()
        zero = 0.0 if self.zero_point is None else self.zero_point.t().repeat_interleave(self.group_size, 1)
        return ((q - zero) * self.scale.t().repeat_interleave(self.group_size, 1)).to(self.dtype)


class PackedInt4Linear(QuantLinear):
    """W4A16 on a GPU: compressed-tensors' own layout (int32 words [N, K/8]) read by the Triton
    kernel in inferlab.kernels, which dequantizes tile by tile."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.group_size = _group_of(qw)
        self.register_buffer("packed", pack_int32(qw.codes, 4))  # int32 [N, K/8]
        self.register_buffer("scale", qw.scale.to(dtype).contiguous())  # [N, G]
        self.register_buffer("zero_point", qw.zero_point)  # int8 [N, G] or None

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        from inferlab.kernels.triton_w4a16 import w4a16_linear

        return w4a16_linear(x, self.packed, self.scale, self.group_size,
                            weight_zero_point=self.zero_point)


class DequantLinear(QuantLinear):
    """Any weight-only layout the fast kernels do not take: int codes kept as int8 (or fp8 codes),
    dequantized per call. Used for grouped int8, int4 shapes the kernels refuse, int8 off-CPU."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("codes", qw.codes.contiguous())
        self.register_buffer("scale", qw.scale.to(dtype))  # [N, G]
        self.register_buffer("zero_point", qw.zero_point)  # int8 [N, G] or None

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight())

    def dequantized_weight(self) -> torch.Tensor:
        n, k = self.codes.shape
        groups = self.scale.shape[1]
        w = self.codes.to(self.dtype).view(n, groups, k // groups)
        if self.zero_point is not None:
            w = w - self.zero_point.to(self.dtype).unsqueeze(-1)
        return (w * self.scale.unsqueeze(-1)).view(n, k)


class Int8DynamicLinear(QuantLinear):
    """W8A8: int8 weights per channel, activations quantized per token at run time, int8 GEMM.

    On x86 the GEMM is oneDNN's int8 linear (`onednn.qlinear_pointwise`, the kernel Inductor uses
    for int8): measured 1.1 ms vs 2.7 ms for `torch._int_mm` and 2.2 ms for bf16 on a 512x576 @
    576x3072 product here; it also applies the per-channel weight scales and writes bf16, leaving
    only the per-token scale. `torch._int_mm` elsewhere.
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
        x_scale = scaled_mm.activation_scale(x, INT8_MAX, self.input_scale)  # [M, 1]
        xq = x.to(torch.float32, copy=True).div_(x_scale).round_()  # [M, K]
        if self.input_scale is not None:  # |x| / (absmax / 127) <= 127 only for dynamic scales
            xq.clamp_(-INT8_MAX - 1, INT8_MAX)
        xq = xq.to(torch.int8)
        if self.onednn:
            out_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
            y = torch.ops.onednn.qlinear_pointwise(  # sum_k xq*q * scale[n]: [M, N]
                xq, 1.0, 0, self.qweight, self.scale, self.zero_points, None, 1.0, 0, out_dtype,
                "none", [], "")
            return y.mul_(x_scale.to(out_dtype)).to(self.dtype)
        acc = torch._int_mm(xq, self.qweight.t())  # int32 [M, N], exact
        return acc.to(torch.float32).mul_(x_scale).mul_(self.scale).to(self.dtype)


@functools.cache
def onednn_int8_available() -> bool:
    """Whether this torch has oneDNN's int8 linear and it computes a small product exactly."""
    if not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    try:
        w = torch.tensor([[1, -2, 3, 127], [-127, 5, 0, 7]], dtype=torch.int8)
        x = torch.tensor([[2, 1, -1, 1]], dtype=torch.int8)
        packed = torch.ops.onednn.qlinear_prepack(w, [1, 4])
        y = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, torch.ones(2), torch.zeros(2, dtype=torch.int64),
                                               None, 1.0, 0, torch.float32, "none", [], "")
        return y.tolist() == [[124.0, -242.0]]
    except RuntimeError:
        return False


class PackedW8A8Linear(CKernelLinear):
    """W8A8 for bf16 on CPU through dynamic_linear.c: int8 codes in quads [N/16, K/4, 16, 4], fp32
    per-channel scales; each call quantizes x per token in C, then vpdpbusd (up to 4 rows) or
    AMX int8 tiles (more), exact int32 sums scaled and rounded to bf16 once."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("packed", vnni.pack_int8(qw.codes, inputs=4))
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

    def c_desc(self) -> cpu_ops.LinearDesc:
        return cpu_ops.LinearDesc(
            kind=cpu_ops.LINEAR_W8A8, n_out=self.out_features, k_in=self.in_features,
            weight=self.packed.data_ptr(), scale=self.scale.data_ptr(),
            bias=_ptr(self.bias),
            weight_sums=self.weight_sums.data_ptr(), input_scale=_ptr(self.input_scale))


class PackedFp8Linear(CKernelLinear):
    """FP8_DYNAMIC for bf16 on CPU through dynamic_linear.c: e4m3 codes in the bf16 kernels' pair
    layout [N/16, K/2, 16, 2] (one byte each), fp32 per-channel scales; each call rounds x to
    fp8 per token in C, and the exact products are summed in fp32 (vdpbf16ps up to 4 rows, AMX
    bf16 tiles above), scaled and rounded to bf16 once."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.register_buffer("packed", vnni.pack_int8(qw.codes.view(torch.uint8), inputs=2))
        self.register_buffer("scale", qw.scale.reshape(n).float().contiguous())
        self.register_buffer("input_scale", _input_scale(qw))  # fp32 [1] (static) or None

    @staticmethod
    def fits(qw: QuantizedWeight, activations: ActivationArgs, dtype: torch.dtype,
             device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.bfloat16 and activations.kind != INT
                and qw.codes.dtype == torch.float8_e4m3fn and qw.scale.numel() == n
                and cpu_ops.dynamic_linear_available() and cpu_ops.bf16_linear_fits(n, k))

    def c_desc(self) -> cpu_ops.LinearDesc:
        return cpu_ops.LinearDesc(
            kind=cpu_ops.LINEAR_FP8, n_out=self.out_features, k_in=self.in_features,
            weight=self.packed.data_ptr(), scale=self.scale.data_ptr(),
            bias=_ptr(self.bias),
            input_scale=_ptr(self.input_scale))


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
        size = self.activations.group_size
        xg = x.float().view(m, k // size, size)  # [M, G, size]
        qmax = FP8_MAX if self.activations.kind != INT else INT8_MAX
        x_scale = xg.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12).div_(qmax)  # [M, G, 1]
        xq = xg / x_scale
        xq = xq.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() if qmax == FP8_MAX else xq.round_()
        return F.linear((xq * x_scale).view(m, k).to(self.dtype), self.dequantized_weight())


def _input_scale(qw: QuantizedWeight) -> torch.Tensor | None:
    return None if qw.input_scale is None else qw.input_scale.reshape(1).float().contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _group_of(qw: QuantizedWeight) -> int:
    """Inputs per scale column."""
    return qw.shape[1] // qw.scale.shape[1]


def kernel_group_size(qw: QuantizedWeight) -> int:
    """The CPU int4 kernel's group size for this weight: its own, or for per-channel scales the
    largest supported size dividing K (the scale is repeated, which changes nothing)."""
    group = _group_of(qw)
    if group in int4_cpu.SUPPORTED_GROUP_SIZES:
        return group
    fits = [g for g in int4_cpu.SUPPORTED_GROUP_SIZES if group % g == 0]
    return max(fits) if fits else 0


def build_quant_linear(qw: QuantizedWeight, activations: ActivationArgs | None,
                       bias: torch.Tensor | None, dtype: torch.dtype,
                       device: torch.device | str = "cpu") -> QuantLinear:
    """The fastest layer for this weight on `device`; tensors are moved there first."""
    device = torch.device(device)
    if activations is not None and activations.static != (qw.input_scale is not None):
        raise ValueError("static activations need the weight's input_scale, dynamic ones none")
    qw = QuantizedWeight(qw.codes.to(device), qw.scale.to(device),
                         None if qw.zero_point is None else qw.zero_point.to(device), qw.args,
                         None if qw.input_scale is None else qw.input_scale.to(device))
    bias = None if bias is None else bias.to(device)
    args = qw.args
    if activations is not None and activations.group_size is not None:
        return GroupDynamicLinear(qw, activations, bias, dtype)
    if activations is not None and PackedW8A8Linear.fits(qw, activations, dtype, device):
        return PackedW8A8Linear(qw, bias, dtype)
    if activations is not None and PackedFp8Linear.fits(qw, activations, dtype, device):
        return PackedFp8Linear(qw, bias, dtype)
    if activations is not None:
        cls = Int8DynamicLinear if activations.kind == INT else Fp8DynamicLinear
        return cls(qw, bias, dtype)
    on_cpu = device.type == "cpu"
    if PackedQuantLinear.fits(qw, dtype, device):
        return PackedQuantLinear(qw, bias, dtype)
    if args.kind == INT and args.num_bits == 8 and args.strategy not in GROUPED and on_cpu:
        return Int8WeightOnlyLinear(qw, bias, dtype)
    n, k = qw.shape
    if args.kind == INT and args.num_bits == 4:
        if (on_cpu and kernel_group_size(qw)
                and int4_cpu.can_pack(n, k, kernel_group_size(qw))):
            return Int4WeightOnlyLinear(qw, bias, dtype)
        if device.type == "cuda" and _group_of(qw) % 16 == 0 and k % 8 == 0:
            return PackedInt4Linear(qw, bias, dtype)
    return DequantLinear(qw, bias, dtype)
