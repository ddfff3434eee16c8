"""bf16 linear layers with weights pre-packed for oneDNN (AMX / AVX512-BF16 on CPU).

Plain `F.linear` on bf16 reaches only a fraction of memory bandwidth for the few-row matmuls of
decode (a 1728x576 layer, one row: ~240 us plain vs ~80 us packed on this machine's AMX cores,
single-threaded), because the weight is re-laid-out on every call. Packing once at load time
removes that; the packed tensor has the same size as the weight.
"""

from __future__ import annotations

import torch
from torch import nn

# The row count oneDNN tunes the packed layout for; measured on AMX, 128 keeps 1-row decode at
# the bandwidth roofline and does not slow the 256-2048-row matmuls of prefill.
_PACK_ROWS_HINT = 128


def packed_linear_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T + b with W packed for oneDNN; holds no other copy of W."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed_weight",
                             torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # [M, in]
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed_weight, self.bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linears(model: nn.Module) -> int:
    """Swap every bf16 nn.Linear of `model` for a PackedLinear; returns how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped
