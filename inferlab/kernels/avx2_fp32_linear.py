"""Dense fp32 linear layers on an AVX2 + FMA CPU (no AVX-512, e.g. AMD EPYC Zen 3) through
avx2_quant_linear.c's kernel with fp32 weights (bits 32), in its layout of blocks of 8 outputs.

oneDNN's fp32 matmul reads a decode step's weights at 12-17 GB/s here; the kernel, which reads
each weight vector once for up to 8 rows, at ~25 GB/s (the machine's read bandwidth). Streaming
SmolLM2-135M's 30 layers' linears from DRAM (2 cores, median of 7 rounds, ms):

  | rows | oneDNN | kernel        | unpack + oneDNN |
  |------|--------|---------------|-----------------|
  | 1    | 28.0   | 18.1 (1.55x)  | 38.8 (0.72x)    |
  | 4    | 41.5   | 20.5 (2.02x)  | 51.3 (0.81x)    |
  | 8    | 47.6   | 24.4 (1.95x)  | 60.8 (0.78x)    |
  | 16   | 68.4   | 51.5 (1.33x)  | 83.0 (0.82x)    |
  | 32   | 86.1   | 78.0 (1.10x)  | 98.1 (0.88x)    |
  | 64   | 118    | 124 (0.95x)   | 130 (0.90x)     |
  | 512  | 695    | 1002 (0.69x)  | 723 (0.96x)     |

and in a second run: 64 rows 160 / 148 (1.09x) / 194 (0.83x), 96 rows 186 / 202 (0.92x) / 211
(0.88x), 128 rows 230 / 270 (0.85x) / 267 (0.86x), 256 rows 428 / 558 (0.77x) / 455 (0.94x).

So the kernel takes up to AVX2_FP32_MAX_ROWS rows; more unpack the weight to [N, K] into a
temporary for oneDNN's GEMM (the layer holds the packed copy only), whose cost, writing and
reading the weight once more, a prefill's arithmetic hides at 256-512 rows; from 65 to ~200 rows
both cost 8-15% more than oneDNN on an [N, K] weight. Unpacking 128 or 384 outputs at a time,
to stay in L2, lost (0.43-0.81x at 24-64 rows: oneDNN's calls on narrow weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.cpu_linear import replace_linears_keeping_ties
from inferlab.kernels.host_memory import in_huge_pages
from inferlab.kernels.onednn_linear import onednn_linear

BLOCK = 8  # outputs a block (an AVX2 register of fp32)
AVX2_FP32_MAX_ROWS = 96  # the table above: past ~100 rows, unpacking for oneDNN costs less than the kernel


def blocked(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N/8, 8, C], zero rows added up to a whole block."""
    padded = F.pad(t, (0, 0, 0, -t.shape[0] % BLOCK))  # [N8, C]
    return padded.view(-1, BLOCK, t.shape[1])


def outputs_last(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N/8, C, 8]: a block's 8 outputs side by side."""
    return blocked(t).transpose(1, 2).contiguous()


def avx2_fp32_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and cpu_ops.avx2_quant_linear_available()


def avx2_fp32_fits(linear: nn.Linear) -> bool:
    """Whole 8-input steps, fp32 weights."""
    return linear.weight.dtype == torch.float32 and linear.in_features % 8 == 0


class KeptAvx2Desc:
    """For an nn.Module run by avx2_quant_linear.c, which defines c_desc(): its description
    built once (ctypes takes ~7 us) and dropped when its buffers move or it is copied."""

    _desc: cpu_library.Avx2QuantDesc | None = None

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
    """An fp32 nn.Linear whose weight lives only in the kernel's layout [N/8, K, 8]."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", in_huge_pages(outputs_last(linear.weight.detach())))  # [N/8, K, 8]
        self.bias = linear.bias

    def c_desc(self) -> cpu_library.Avx2QuantDesc:
        return cpu_library.Avx2QuantDesc(
            n_out=self.out_features, k_in=self.in_features, group=self.in_features, bits=32,
            codes=self.packed.data_ptr(), scale=None, offset=None, bias=cpu_library.tensor_ptr(self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.shape[0] > AVX2_FP32_MAX_ROWS:
            y = onednn_linear(x2, self.unpacked_weight(), self.bias)
        else:
            y = cpu_ops.avx2_quant_linear(x2 if x2.stride(1) == 1 else x2.contiguous(), self._kept_desc())
        return y.view(*x.shape[:-1], self.out_features)

    def unpacked_weight(self) -> torch.Tensor:
        """A new [N, K] fp32 copy of the weight."""
        return cpu_ops.avx2_quant_dequantize(self._kept_desc())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, AVX2 fp32"


def use_avx2_fp32_linears(model: nn.Module) -> int:
    """Replace the fp32 nn.Linear layers of `model` the kernel fits by Avx2Fp32Linear, in place
    (a tied embedding then reads the head's packed weight); returns how many."""
    return replace_linears_keeping_ties(model, Avx2Fp32Linear, avx2_fp32_fits)
