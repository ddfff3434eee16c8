"""RMSNorm (+ residual add), RoPE and SiLU-and-mul behind one signature each.

CUDA tensors take the Triton kernels (RMSNorm and RoPE; SiLU-and-mul has none and stays in
torch on a GPU), CPU tensors the C kernels (cpu_ops) when they are built, everything else the
torch expressions below, which are also the oracle the kernels are tested
against. The torch forms follow Hugging Face Llama's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.kernels import cpu_ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim. With `residual`: h = x + residual (rounded to the dtype),
    returns (rms_norm(h), h). x and residual may be overwritten: callers pass ones they own."""
    if x.is_cuda:
        from inferlab.kernels import triton_norm_rope

        return triton_norm_rope.rms_norm(x, weight, eps, residual)
    if cpu_ops.available(x, weight):
        return cpu_ops.rms_norm(x, weight, eps, residual)
    return torch_rms_norm(x, weight, eps, residual)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE IN PLACE on q [N, Hq, D] and k [N, Hkv, D] (views of a fused projection
    allowed); cos, sin: fp32 tables [max_positions, D] indexed by positions [N]."""
    if q.is_cuda:
        from inferlab.kernels import triton_norm_rope

        return triton_norm_rope.rotary_embedding(positions, q, k, cos, sin)
    if cpu_ops.available(q, k) and cpu_ops.rotary_fits(q.shape[-1]):
        return cpu_ops.rotary_embedding(positions, q, k, cos, sin)
    return torch_rotary_embedding(positions, q, k, cos, sin)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] -> [..., I]: silu(gate) * up."""
    if cpu_ops.available(gate_up):
        return cpu_ops.silu_and_mul(gate_up)
    return torch_silu_and_mul(gate_up)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        residual = x + residual
        return torch_rms_norm(residual, weight, eps), residual
    # one fused kernel (fp32 inside); for bf16 it may differ from HF's cast-then-scale order by
    # one rounding
    return F.rms_norm(x, weight.shape, weight, eps)


def torch_rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                           cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos_n = cos[positions].unsqueeze(1).to(q.dtype)  # [N, 1, D]
    sin_n = sin[positions].unsqueeze(1).to(q.dtype)
    for x in (q, k):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        x.copy_(x * cos_n + rotated * sin_n)
    return q, k


def torch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
