"""What one rounding to bf16 may do to an exact result, for the kernels' tests."""

from __future__ import annotations

import torch


def half_bf16_ulp(exact: torch.Tensor) -> torch.Tensor:
    """Half a bf16 ulp of each exact value: as far as one rounding to bf16 may move it."""
    return torch.exp2(torch.floor(torch.log2(exact.abs())) - 8)
