"""Building blocks of the Llama family: RMSNorm and the rotary embedding tables."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from inferlab.kernels import fused
from inferlab.models.config import ROPE_TYPES, llama3_freq_factors, rope_kind


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with the residual stream: (norm(x + residual), x + residual)."""
        return fused.rms_norm(x, self.weight, self.eps, residual)


def rope_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                     max_position_embeddings: int, freq_factors: tuple[float, ...] | None = None
                     ) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] of default, linear, llama3 or YaRN RoPE, each divided by
    its pair's freq_factors where given, and the factor YaRN scales cos and sin by (1 for the
    others)."""
    inv_freq, attention = _scaled_frequencies(head_dim, theta, scaling, max_position_embeddings)
    if freq_factors is None:
        return inv_freq, attention
    # ggml's rope divides each pair's angle by its factor before its own scaling, which is
    # linear in the angle: dividing after it is the same
    return (inv_freq / torch.tensor(freq_factors, dtype=torch.float32)).float(), attention


def _scaled_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                        max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / theta ** exponents
    kind = rope_kind(scaling)
    if kind == "default":
        return inv_freq.float(), 1.0
    assert scaling is not None
    if kind == "yarn":
        return _yarn(inv_freq, theta, scaling, max_position_embeddings)
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float(), 1.0
    if kind == "llama3":
        low, high = llama3_freq_factors(scaling)
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_ctx / wavelen - low) / (high - low)).clamp(0, 1)
        # long wavelengths scaled by 1/factor, short ones kept, a linear blend between
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return scaled.float(), 1.0
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: {', '.join(ROPE_TYPES)})")


def _yarn(inv_freq: torch.Tensor, theta: float, scaling: dict[str, Any],
          max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): a pair that turns more than beta_fast times over the original
    context keeps its frequency, one that turns under beta_slow times is slowed by the factor,
    a linear ramp between; cos and sin grow by 0.1 ln(factor) + 1."""
    original = float(scaling.get("original_max_position_embeddings") or max_position_embeddings)
    factor = float(scaling.get("factor") or max_position_embeddings / original)
    pairs = len(inv_freq)

    def pair_turning(rotations: float) -> float:  # the pair that turns this often over `original`
        return pairs * math.log(original / (rotations * 2 * math.pi)) / math.log(theta)

    low, high = pair_turning(float(scaling.get("beta_fast") or 32)), pair_turning(float(scaling.get("beta_slow") or 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, 2 * pairs - 1)
    ramp = ((torch.arange(pairs, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    scaled = inv_freq * (1 - ramp) + inv_freq / factor * ramp  # [pairs]
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dims = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dims)
                     if mscale and mscale_all_dims else _yarn_mscale(factor, 1.0))
    return scaled.float(), float(attention)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) RoPE with a precomputed cos/sin table indexed by position."""

    def __init__(self, head_dim: int, max_position_embeddings: int, theta: float,
                 scaling: dict[str, Any] | None, table_positions: int | None = None,
                 freq_factors: tuple[float, ...] | None = None) -> None:
        """max_position_embeddings: the config's (YaRN's defaults derive from it);
        table_positions: the rows of the tables, past it where scaling stretches the context;
        freq_factors: ModelConfig.rope_freq_factors."""
        super().__init__()
        self.head_dim, self.max_position_embeddings = head_dim, max_position_embeddings
        self.theta, self.scaling, self.freq_factors = theta, scaling, freq_factors
        rows = table_positions or max_position_embeddings
        self.register_buffer("cos", torch.empty(rows, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(rows, head_dim), persistent=False)
        if self.cos.device.type != "meta":  # filled once materialized (loader.materialize_buffers)
            self.reset_buffers()

    def reset_buffers(self) -> None:
        """Fill the cos/sin tables (also after the model is materialized from the meta device)."""
        inv_freq, attention = rope_frequencies(self.head_dim, self.theta, self.scaling,
                                               self.max_position_embeddings, self.freq_factors)
        positions = torch.arange(len(self.cos), dtype=torch.float32, device=self.cos.device)
        freqs = torch.outer(positions, inv_freq.to(self.cos.device))
        emb = torch.cat([freqs, freqs], dim=-1)  # [rows, head_dim]
        self.cos, self.sin = emb.cos() * attention, emb.sin() * attention

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (torch's signature)
        # The kernels read fp32 tables whatever dtype the model is cast to: rebuild, don't cast.
        super()._apply(fn, recurse)
        self.reset_buffers()
        return self
