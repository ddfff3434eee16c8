"""fp32 linear layers on CPU through oneDNN's matmul instead of torch's default, MKL's sgemm.

MKL takes a slow path on AMD CPUs, worst at the few rows of a decode step; oneDNN's own JIT
kernels do not. On a Zen 5 (2 threads, SmolLM2-135M's shapes): at 6 rows a 3072x576 layer took
369 us through F.linear and 222 us through oneDNN, the 49152x576 head 23.7 and 7.1 ms; at 512
rows the 3072x576 layer 10.5 and 9.1 ms. On the Intel Xeon with AMX (where bf16 is the default)
the two are closer and both far from the memory bandwidth: 30 layers' linears streamed from
DRAM at 1 row read 25 GB/s through F.linear and 17 GB/s through oneDNN, at 6 rows 13.5 and
13.2 GB/s (ad hoc, 2026-12-05). The sums come in another order, so the outputs differ from
F.linear's in the last bits (~1e-6 relative).
"""

from __future__ import annotations

import torch
from torch import nn

from inferlab.kernels.cpu_linear import replace_linears


def onednn_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                  ) -> torch.Tensor:  # x [..., K], weight [N, K] -> [..., N]
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(nn.Module):
    """An fp32 nn.Linear computed by oneDNN; it holds the same parameters (a tied head stays tied)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [N, K]
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        return onednn_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN fp32"


def use_onednn_linears(model: nn.Module) -> int:
    """Replace every fp32 nn.Linear of `model` by a OneDnnLinear, in place; returns how many."""
    return replace_linears(model, OneDnnLinear, lambda child: child.weight.dtype == torch.float32)
