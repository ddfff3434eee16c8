"""bf16 linear layers on CPU: decode rows through the C matrix-vector kernel, the rest oneDNN.

A decode step multiplies a few rows by every weight, so it is bound by reading the weights.
oneDNN's bf16 path reaches about a third of the memory bandwidth there (a 1728x576 layer, one
row: ~210 us from memory on this machine; the C kernel: ~70 us); with more rows its AMX
kernels win, so up to GEMV_MAX_ROWS rows go to the C kernel and the rest to F.linear. The
weight stays in its row-major form, one copy, used by both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.kernels import cpu_ops


def decode_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_ops.gemv_available()


class DecodeLinear(nn.Linear):
    """nn.Linear whose few-row products take the C kernel; same parameters, same state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= cpu_ops.GEMV_MAX_ROWS and x.dtype == torch.bfloat16:
            return cpu_ops.bf16_gemv(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_decode_linears(model: nn.Module) -> int:
    """Turn every bf16 nn.Linear of `model` into a DecodeLinear in place; returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16:
            module.__class__ = DecodeLinear
            swapped += 1
    return swapped
