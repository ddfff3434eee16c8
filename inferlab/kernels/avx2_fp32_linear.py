"""Dense fp32 linear layers on an AVX2 + FMA CPU (no AVX-512, e.g. AMD EPYC Zen 3) through
avx2_quant_linear.c's kernel with fp32 weights (bits 32), in its layout of blocks of 8 outputs.

oneDNN's fp32 matmul reads a decode step's weights at 12-17 GB/s here; the kernel, whose tiles
of 24 outputs by 4 rows read each weight vector once for 4 rows and each input once for 24
outputs, at the machine's read bandwidth, and from ~64 rows on near the FMAs' peak. SmolLM2-135M's
linears (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536) on 2 cores, oneDNN, the
kernel's old tiles (a block of 8 outputs by up to 8 rows), the kernel, and unpacking the weight
for oneDNN, in turn in one process, median of 7 rounds; CPU time (OMP_WAIT_POLICY=passive,
process CPU time / 2): other jobs kept the 2 cores busy (load average ~5), and wall times
measured their preemptions (70 ms for a one-row call); 2026-12-06. Streaming 30 layers from
DRAM, ms, and the speed as a multiple of oneDNN's:

  | rows | oneDNN | old tiles | kernel        | unpack + oneDNN |
  |------|--------|-----------|---------------|-----------------|
  | 1    | 23.8   | 17.7      | 14.6 (1.63x)  | 49.1 (0.48x)    |
  | 4    | 54.5   | 28.0      | 18.5 (2.95x)  | 89.9 (0.61x)    |
  | 8    | 56.9   | 33.7      | 24.6 (2.31x)  | 88.9 (0.64x)    |
  | 16   | 76.7   | 62.9      | 38.2 (2.00x)  | 115 (0.67x)     |
  | 32   | 96.1   | 96.9      | 59.6 (1.61x)  | 133 (0.72x)     |
  | 64   | 157    | 173       | 106 (1.49x)   | 188 (0.84x)     |
  | 96   | 194    | 241       | 140 (1.39x)   | 224 (0.87x)     |
  | 128  | 247    | 305       | 194 (1.27x)   | 278 (0.89x)     |
  | 256  | 416    | 801       | 338 (1.23x)   | 435 (0.96x)     |
  | 512  | 834    | 1401      | 715 (1.17x)   | 891 (0.94x)     |
  | 1024 | 1758   | 3436      | 1605 (1.10x)  | 1874 (0.94x)    |
  | 2048 | 3216   | 6170      | 3535 (0.91x)  | 3254 (0.99x)    |

One copy of the 4 layers (from L3; "hot", 9 rounds), the kernel against oneDNN in GFLOP/s:
22.4 / 8.5 at 1 row, 88.1 / 30.0 at 8, 126 / 65.0 at 32, 146 / 102 at 96, 153 / 117 at 256,
134 / 121 at 512, 154 / 128 at 1024, 115 / 124 at 2048 (the old tiles 13.5-92.2).

One thread, CPU time, the kernel's speed over oneDNN's: streamed 1.79x at 1 row, 1.49x at 64,
1.21x at 512; hot 2.54x, 1.46x, 1.17x, and 1.05x at 2048.

So the kernel takes up to AVX2_FP32_MAX_ROWS rows; more (a long prefill step) unpack the
weight to [N, K] into a temporary for oneDNN's GEMM (the layer holds the packed copy only),
whose cost, writing and reading the weight once more, is 1-7% of oneDNN's at 1024-2048 rows.
Unpacking 128 or 384 outputs at a time, to stay in L2, lost (0.43-0.81x at 24-64 rows:
oneDNN's calls on narrow weights).

A layer holds its weight in fewer bytes where that keeps every value (narrow): a GGUF model's
Q4_1 / Q4_0 / Q8_0 blocks as their codes (block_codes.py; the kernel sums their values in the fp32
order), a bf16 checkpoint's as bf16. The embedded model's decoder, 30 layers at one row: 7.9-8.4
ms as codes against 16.9 held in fp32, 2.0x (2 cores, two builds in one process, best of 9).
"""

from __future__ import annotations

import torch
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.avx2_blocks import BLOCK, outputs_last, pack_codes
from inferlab.kernels.block_codes import GGUF_BLOCK, block_codes
from inferlab.kernels.cpu_linear import replace_linears_keeping_ties
from inferlab.kernels.host_memory import in_huge_pages
from inferlab.kernels.onednn_linear import onednn_linear

AVX2_FP32_MAX_ROWS = 1024  # the tables above: the kernel is faster up to 1024 rows, 0.91-0.93x at 2048


def avx2_fp32_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and cpu_ops.avx2_quant_linear_available()


def avx2_fp32_fits(linear: nn.Linear) -> bool:
    """Whole 8-input steps, fp32 weights."""
    return linear.weight.dtype == torch.float32 and linear.in_features % 8 == 0


# rows the kernel decodes at a time to check a layer's codes: a tied head's whole weight decoded
# at once was a second fp32 copy of it (113 MB) at the load's peak
CHECK_ROWS = 4096


def _decodes_to(desc: cpu_library.Avx2QuantDesc, weight: torch.Tensor) -> bool:
    """Whether the codes `desc` describes decode, in the kernel, to `weight` [N, K] exactly."""
    for first in range(0, weight.shape[0], CHECK_ROWS):
        ids = torch.arange(first, min(first + CHECK_ROWS, weight.shape[0]))
        if not torch.equal(cpu_ops.avx2_quant_rows(desc, ids), weight[first:first + CHECK_ROWS]):
            return False
    return True


class KeptAvx2Desc:
    """For an nn.Module run by avx2_quant_linear.c, which defines c_desc(): its description
    built once (ctypes takes ~7 us) and dropped when its buffers move or it is copied."""

    _desc: cpu_library.Avx2QuantDesc | None = None
    kernel_max_rows: int  # the most rows a call gives the kernel; more go through oneDNN

    def _apply(self, fn, recurse: bool = True) -> nn.Module:
        """Moving the buffers (.to, .share_memory) moves the pointers the kernel reads."""
        self._desc = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        """A copy (deepcopy, pickle) describes its own buffers; ctypes refuses to copy pointers."""
        return {**self.__dict__, "_desc": None}

    def _kept_desc(self) -> cpu_library.Avx2QuantDesc:
        if self._desc is None:
            self._desc = self.c_desc()
        return self._desc


class Avx2Fp32Linear(KeptAvx2Desc, nn.Module):
    """An fp32 nn.Linear whose weight lives only in the kernel's layout [N/8, K, 8]: fp32, bf16
    where every value is a bf16 number (narrow_to_bf16), or the int4 or int8 codes of GGUF blocks
    whose values every weight is (narrow_to_codes)."""

    kernel_max_rows = AVX2_FP32_MAX_ROWS

    def __init__(self, linear: nn.Linear, narrow: bool = False, codes_only: bool = False) -> None:
        """narrow: hold the weight in the fewest bytes that keep its values: codes, else bf16
        unless codes_only (a tied head: its embedding reads fp32 rows, or the codes' values)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", None)  # [N/8, K, 8] fp32 or bf16, or the codes
        self.register_buffer("scale", None)  # codes: fp32 [N/8, K/32, 8], and the offsets (4 bits)
        self.register_buffer("offset", None)
        self.code_bits = 0  # 0: dense weights in `packed`; 4 or 8: codes there
        self.bias = linear.bias
        weight = linear.weight.detach()  # [N, K]
        if not (narrow and self._hold_codes(weight)):  # codes straight from it: no fp32 copy
            self.packed = in_huge_pages(outputs_last(weight))
            if narrow and not codes_only:
                self.narrow_to_bf16()

    def narrow_to_codes(self) -> bool:
        """Keep the weight as the codes of Q4_1, Q4_0 or Q8_0 blocks (a GGUF model run in fp32) when
        the kernel's values of them are every weight exactly: 0.19x or 0.28x the bytes a decode
        step reads, the same outputs (the kernel sums them in the fp32 order). Returns whether it
        did."""
        if self.code_bits:
            return True
        return self.packed.dtype == torch.float32 and self._hold_codes(self.unpacked_weight())

    def _hold_codes(self, weight: torch.Tensor) -> bool:
        """Hold `weight` [N, K] as its blocks' codes if the kernel's values of those are it."""
        if block_codes(weight[:BLOCK]) is None:  # most fp32 checkpoints fail on their first outputs
            return False
        found = block_codes(weight)
        if found is None:
            return False
        codes = pack_codes(found.codes - 8 if found.bits == 4 else found.codes, found.bits)
        scale = outputs_last(found.scale)
        offset = None if found.offset is None else outputs_last(found.offset)
        if not _decodes_to(self._codes_desc(found.bits, codes, scale, offset), weight):
            return False
        self.packed, self.scale, self.offset = in_huge_pages(codes), scale, offset
        self.code_bits, self._desc = found.bits, None
        return True

    def narrow_to_bf16(self) -> bool:
        """Keep the weight as bf16 if that is exact (a bf16 checkpoint run in fp32): half the
        bytes a decode step reads, the same products (the kernel widens them as it reads), so
        the same outputs. Returns whether it did."""
        if self.packed.dtype == torch.bfloat16:
            return True
        if self.code_bits:
            return False
        first = self.packed[:1]  # a block: most fp32 checkpoints fail here, before a full copy
        if not torch.equal(first.to(torch.bfloat16).float(), first):
            return False
        narrow = self.packed.to(torch.bfloat16)
        if not torch.equal(narrow.float(), self.packed):
            return False
        self.packed = in_huge_pages(narrow)
        self._desc = None
        return True

    def _codes_desc(self, bits: int, codes: torch.Tensor, scale: torch.Tensor,
                    offset: torch.Tensor | None) -> cpu_library.Avx2QuantDesc:
        return cpu_library.Avx2QuantDesc(
            n_out=self.out_features, k_in=self.in_features, group=GGUF_BLOCK, bits=bits,
            codes=codes.data_ptr(), scale=scale.data_ptr(), offset=cpu_library.tensor_ptr(offset),
            bias=cpu_library.tensor_ptr(self.bias), dense_order=1)

    def c_desc(self) -> cpu_library.Avx2QuantDesc:
        if self.code_bits:
            return self._codes_desc(self.code_bits, self.packed, self.scale, self.offset)
        bits = 16 if self.packed.dtype == torch.bfloat16 else 32
        return cpu_library.Avx2QuantDesc(
            n_out=self.out_features, k_in=self.in_features, group=self.in_features, bits=bits,
            codes=self.packed.data_ptr(), scale=None, offset=None, bias=cpu_library.tensor_ptr(self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.shape[0] > self.kernel_max_rows:
            y = onednn_linear(x2, self.unpacked_weight(), self.bias)
        else:
            y = cpu_ops.avx2_quant_linear(x2 if x2.stride(1) == 1 else x2.contiguous(), self._kept_desc())
        return y.view(*x.shape[:-1], self.out_features)

    def unpacked_weight(self) -> torch.Tensor:
        """A new [N, K] fp32 copy of the weight."""
        return cpu_ops.avx2_quant_dequantize(self._kept_desc())

    def extra_repr(self) -> str:
        held = f"int{self.code_bits} blocks" if self.code_bits else str(self.packed.dtype).removeprefix("torch.")
        return f"in_features={self.in_features}, out_features={self.out_features}, AVX2 fp32 ({held})"


def use_avx2_fp32_linears(model: nn.Module, narrow: bool = True) -> int:
    """Replace the fp32 nn.Linear layers of `model` the kernel fits by Avx2Fp32Linear, in place
    (a tied embedding then reads the head's packed weight), held as GGUF blocks' codes or bf16
    where that is exact unless not `narrow`; returns how many. The head narrows only to codes,
    whose rows a tied embedding reads through the kernel."""
    head = getattr(model, "lm_head", None)
    return replace_linears_keeping_ties(
        model, lambda linear: Avx2Fp32Linear(linear, narrow=narrow, codes_only=linear is head), avx2_fp32_fits)
