"""torch's fp8 rounding of activations, the reference the C kernels' rounding is held to."""

from __future__ import annotations

import torch


def fp8_reference_round(x: torch.Tensor, static_scale: float | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (or one static scale's) fp8 rounding, as Fp8DynamicLinear does it: (fp8 values
    as fp32, scales [M, 1])."""
    if static_scale is None:
        x_scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    else:
        x_scale = torch.full((x.shape[0], 1), static_scale)
    return (x.float() / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn).float(), x_scale
