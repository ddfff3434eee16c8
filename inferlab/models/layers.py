"""Building blocks of the Llama family: RMSNorm and the rotary embedding tables."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from inferlab.kernels import fused


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with the residual stream: (norm(x + residual), x + residual)."""
        return fused.rms_norm(x, self.weight, self.eps, residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] for default, linear and llama3 RoPE."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / theta ** exponents
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq.float()
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_ctx / wavelen - low) / (high - low)).clamp(0, 1)
        # long wavelengths scaled by 1/factor, short ones kept, a linear blend between
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return scaled.float()
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) RoPE with a precomputed cos/sin table indexed by position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim, self.max_positions = head_dim, max_positions
        self.theta, self.scaling = theta, scaling
        self.register_buffer("cos", torch.empty(max_positions, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, head_dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Fill the cos/sin tables (also after the model is materialized from the meta device)."""
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(self.cos.device)
        positions = torch.arange(self.max_positions, dtype=torch.float32, device=self.cos.device)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_positions, head_dim]
        self.cos, self.sin = emb.cos(), emb.sin()

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (torch's signature)
        # The kernels read fp32 tables whatever dtype the model is cast to: rebuild, don't cast.
        super()._apply(fn, recurse)
        self.reset_buffers()
        return self
