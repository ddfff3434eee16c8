"""Quantized linear layers: weights resident at their compressed size, a kernel chosen per call.

Every layer keeps only its compressed weight (int8, packed int4 or fp8 codes plus small scales)
and picks its arithmetic by the number of rows in the call:

* weight-only int8/int4 (W8A16, W4A16), bf16 on a CPU with AVX512-BF16: the C kernels of
  inferlab/kernels/cpu/quant_linear.c, in their own layouts (PackedQuantLinear). Up to 64 rows
  (a decode batch) the codes load as `vpdpbusd`'s unsigned operand (AMX int8 tiles from 13
  rows) against 14-bit activation codes, so a decode step reads a half or a quarter of bf16's
  bytes and each row gets the bits it gets alone; more rows dequantize the weight to bf16 (on
  AMX a chunk at a time, in each thread's L2) and take the GEMM, which a prefill is bound by the
  arithmetic of.
* weight-only int8/int4 for fp32 on a CPU with AVX2 + FMA: avx2_quant_linear.c (Avx2QuantLinear),
  whose decode rows read each code once and widen it for all of them; more rows than
  AVX2_KERNEL_MAX_ROWS dequantize the weight to fp32 and take oneDNN's GEMM.
* weight-only elsewhere (bf16 without AVX512-BF16, shapes the kernels refuse): torch's CPU kernels
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
* activations quantized too (W8A8, FP8_DYNAMIC, FP8, FP8_BLOCK): linear_dynamic.py.
"""

from __future__ import annotations

import abc

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.kernels import avx2_blocks, cpu_library, cpu_ops
from inferlab.kernels.avx2_fp32_linear import KeptAvx2Desc
from inferlab.kernels.cpu_linear import CLinear
from inferlab.kernels.host_memory import in_huge_pages
from inferlab.quant.formats import int4_cpu, vnni
from inferlab.quant.formats.int_pack import pack_int32
from inferlab.quant.qparams import QuantizedWeight
from inferlab.quant.scheme import GROUPED, INT, ActivationArgs

# Largest row count that takes the weight-only kernels (the table in the module docstring).
INT8_KERNEL_MAX_ROWS = 12
INT4_KERNEL_MAX_ROWS = 128
# Largest row count that takes avx2_quant_linear.c's kernel; more dequantize and take oneDNN's
# GEMM. The model's linears on an AMD EPYC Zen 3, the kernel's time against that path's: 2 cores,
# 0.78-0.85x at 32 rows, 0.83-0.88x at 48, 0.88-1.0x at 64; 1 core, 0.65-0.7x at 16, 0.9-1.2x
# at 24, 1.1-1.25x at 32
AVX2_KERNEL_MAX_ROWS = 32


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
        # torch's kernel reads past a bf16 row whose length is not a multiple of 16 (garbage,
        # then a segfault: torch 2.13); fp32 rows of any length are read right
        fits = xs.dtype == torch.float32 or self.in_features % 16 == 0
        if fits and x.shape[0] <= INT8_KERNEL_MAX_ROWS and x.device.type == "cpu":
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


class CKernelLinear(QuantLinear, CLinear):
    """A quantized layer the C kernels run through linear_forward (also inside the whole-model
    call, see inferlab/kernels/cpu_model.py); the bias is added inside, before the one rounding
    to bf16."""

    bias_in_matmul = True

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_ops.linear_forward(x, self.c_desc())


class PackedQuantLinear(CKernelLinear):
    """W8A16 or W4A16 for bf16 on CPU, in quant_linear.c's layouts (inferlab.quant.formats.vnni):
    codes, bf16 scales and (when asymmetric) zero points [N/16, K/G, 16]. Scales in the
    compute dtype, as vLLM's weight-only kernels take them: a bf16 checkpoint's pass unchanged,
    fp32 ones round once (2^-9 relative at most); zero points are integers, exact in bf16."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.bits, self.group_size = qw.args.num_bits, _group_of(qw)
        pack = vnni.pack_uint8_quads if self.bits == 8 else vnni.pack_int4
        self.register_buffer("packed", in_huge_pages(pack(qw.codes)))
        self.register_buffer("scale", vnni.pack_block_groups(qw.scale.to(torch.bfloat16)))
        zero = None if qw.zero_point is None else vnni.pack_block_groups(qw.zero_point.to(torch.bfloat16))
        self.register_buffer("zero_point", zero)  # as the scales, or None

    @staticmethod
    def fits(qw: QuantizedWeight, dtype: torch.dtype, device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.bfloat16 and qw.args.kind == INT
                and qw.args.num_bits in (4, 8) and cpu_ops.quant_linear_available()
                and cpu_ops.bf16_linear_fits(n, k) and _group_of(qw) % 8 == 0)

    def c_desc(self) -> cpu_library.LinearDesc:
        kind = cpu_library.LINEAR_INT8 if self.bits == 8 else cpu_library.LINEAR_INT4
        return cpu_library.LinearDesc(
            kind=kind, n_out=self.out_features, k_in=self.in_features, group=self.group_size,
            weight=self.packed.data_ptr(), group_scale=self.scale.data_ptr(),
            group_zero=None if self.zero_point is None else self.zero_point.data_ptr(),
            bias=cpu_library.tensor_ptr(self.bias))

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] in the compute dtype: (q - zero point) * scale per group."""
        unpack = vnni.unpack_uint8_quads if self.bits == 8 else vnni.unpack_int4
        q = unpack(self.packed).float()
        zero = 0.0 if self.zero_point is None else vnni.unpack_block_groups(
            self.zero_point).repeat_interleave(self.group_size, 1)
        scale = vnni.unpack_block_groups(self.scale).repeat_interleave(self.group_size, 1)
        return ((q - zero) * scale).to(self.dtype)


class Avx2QuantLinear(KeptAvx2Desc, QuantLinear):
    """W8A16 or W4A16 for fp32 on a CPU with AVX2 + FMA, in avx2_quant_linear.c's layout
    (inferlab.kernels.avx2_blocks): decode rows read the codes once and share each
    dequantized vector between the rows; more rows dequantize the whole weight for F.linear."""

    bias_in_matmul = True
    kernel_max_rows = AVX2_KERNEL_MAX_ROWS

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        n, k = qw.shape
        super().__init__(k, n, bias, dtype)
        self.bits, self.group_size = qw.args.num_bits, _group_of(qw)
        self.register_buffer("packed", in_huge_pages(avx2_blocks.pack_codes(qw.codes, self.bits)))
        scale, offset = avx2_blocks.pack_group_params(qw.scale, qw.zero_point, self.bits)
        self.register_buffer("scale", scale)  # fp32 [N/8, G, 8]
        self.register_buffer("offset", offset)  # fp32 [N/8, G, 8], None when symmetric

    @staticmethod
    def fits(qw: QuantizedWeight, dtype: torch.dtype, device: torch.device) -> bool:
        n, k = qw.shape
        return (device.type == "cpu" and dtype == torch.float32 and qw.args.kind == INT
                and qw.args.num_bits in (4, 8) and avx2_blocks.fits(n, k, _group_of(qw))
                and cpu_ops.avx2_quant_linear_available())

    def c_desc(self) -> cpu_library.Avx2QuantDesc:
        return cpu_library.Avx2QuantDesc(
            n_out=self.out_features, k_in=self.in_features, group=self.group_size, bits=self.bits,
            codes=self.packed.data_ptr(), scale=self.scale.data_ptr(), offset=cpu_library.tensor_ptr(self.offset),
            bias=cpu_library.tensor_ptr(self.bias))

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.kernel_max_rows:
            return cpu_ops.avx2_quant_linear(x, self._kept_desc())  # [M, N]
        return F.linear(x, self.dequantized_weight(), self.bias)

    def dequantized_weight(self) -> torch.Tensor:
        """[N, K] fp32: (q - zero point) * scale, as the kernel computes it."""
        return cpu_ops.avx2_quant_dequantize(self._kept_desc())


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
    if activations is not None:
        from inferlab.quant.linear_dynamic import build_dynamic_linear  # it builds on this module

        return build_dynamic_linear(qw, activations, bias, dtype, device)
    on_cpu = device.type == "cpu"
    if PackedQuantLinear.fits(qw, dtype, device):
        return PackedQuantLinear(qw, bias, dtype)
    if Avx2QuantLinear.fits(qw, dtype, device):
        return Avx2QuantLinear(qw, bias, dtype)
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
