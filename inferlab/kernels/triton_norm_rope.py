"""Fused RMSNorm (optionally with the residual add) and rotary embedding, one launch each.

In eager torch an RMSNorm is ~6 kernels (cast, square, mean, rsqrt, two multiplies) and RoPE
~12 (gathers, casts, rotate-half, products, sums), each a full pass over the activations. On a
GPU these are launch- and bandwidth-bound; fused, each is one read and one write.

Rounding follows HF Llama: RMSNorm normalises in fp32, rounds to the input dtype, then
multiplies by the weight; the residual add is rounded to the input dtype before it is
normalised. The torch reference (kernels/fused.py: torch_rms_norm, F.rms_norm) scales inside
one fp32 kernel instead, so for bf16 the two may differ by one rounding. RoPE computes in fp32
and rounds once, so it is slightly more exact than torch_rotary_embedding's bf16 expression.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.kernels.triton_common import check_device, dual_jit


@dual_jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,  # rows of [M, H]; w [H]
    x_stride, res_stride, out_stride, res_out_stride, eps,
    H: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + offs, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(res_out_ptr.dtype.element_ty)  # the residual stream keeps its dtype
        tl.store(res_out_ptr + row * res_out_stride + offs, summed, mask=mask)
        x = summed.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
    normed = (x * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offs, (normed * w).to(out_ptr.dtype.element_ty),
             mask=mask)


def _rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    t2 = t.reshape(-1, hidden)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim: x [..., H], weight [H] -> [..., H] in x.dtype.

    With `residual`, first forms h = x + residual and returns (rms_norm(h), h): the fused
    "add the sublayer's output to the residual stream, normalise for the next sublayer".
    """
    device = check_device(x, weight)
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({hidden},)")
    x2 = _rows(x, hidden)  # [M, H]
    out = x2.new_empty(x2.shape)
    has_res = residual is not None
    res2 = _rows(residual, hidden) if has_res else x2
    res_out = torch.empty_like(out) if has_res else out
    if x2.shape[0]:
        _rms_norm_kernel.on(device)[(x2.shape[0],)](
            x2, res2, weight, out, res_out, x2.stride(0), res2.stride(0), out.stride(0),
            res_out.stride(0), eps, H=hidden, BLOCK=triton.next_power_of_2(hidden),
            HAS_RESIDUAL=has_res, num_warps=8 if hidden >= 4096 else 4,
        )
    out = out.view(x.shape)
    return (out, res_out.view(x.shape)) if has_res else out


@dual_jit
def _rope_kernel(
    x_ptr, pos_ptr, cos_ptr, sin_ptr,  # x rows [N, H, D] (in place); cos, sin [P, D]
    tok_stride, head_stride, table_stride,
    H: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    mask = (offs_h < H)[:, None] & (offs_d < HALF)[None, :]
    base = x_ptr + tok * tok_stride + offs_h[:, None] * head_stride + offs_d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)  # [H, D/2] first halves
    x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)  # second halves
    table = pos * table_stride + offs_d
    d_ok = offs_d < HALF
    cos1 = tl.load(cos_ptr + table, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + table + HALF, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + table, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + table + HALF, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    # x * cos + rotate_half(x) * sin, where rotate_half(x) = [-x2, x1]
    tl.store(base, (x1 * cos1 - x2 * sin1).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + HALF, (x2 * cos2 + x1 * sin2).to(x_ptr.dtype.element_ty), mask=mask)


def _rope_in_place(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, device: torch.device) -> None:
    n, heads, dim = x.shape
    if x.stride(2) != 1 or dim % 2:
        raise ValueError("rotary embedding needs an even head dim, contiguous in memory")
    half = dim // 2
    _rope_kernel.on(device)[(n,)](
        x, positions, cos, sin, x.stride(0), x.stride(1), cos.stride(0),
        H=heads, H_PAD=triton.next_power_of_2(heads), HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
    )


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (rotate-half) RoPE applied IN PLACE to q [N, Hq, D] and k [N, Hkv, D].

    positions [N] index the tables cos, sin [max_positions, D]. q and k may be strided views
    (slices of a fused qkv projection); they are returned for convenience.
    """
    device = check_device(positions, q, k, cos, sin)
    if cos.shape != sin.shape or cos.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"tables {tuple(cos.shape)} do not fit head dim {q.shape[-1]}")
    if q.shape[0]:
        cos, sin = cos.contiguous(), sin.contiguous()
        _rope_in_place(q, positions, cos, sin, device)
        _rope_in_place(k, positions, cos, sin, device)
    return q, k
