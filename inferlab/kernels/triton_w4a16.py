"""W4A16: a Triton matmul that dequantizes int4 weights tile by tile, activations in 16 bit.

Weight layout is compressed-tensors' pack-quantized format (what llm-compressor writes for
W4A16): `weight_packed` int32 [N, K/8], eight 4-bit values per word along the input dim,
element k at bits 4*(k % 8) of word k // 8, stored as q + 8 so the word holds 0..15;
`weight_scale` [N, K/G], one scale per group of G inputs; optional `weight_zero_point`
[N, K/G] (signed, unpacked) for the asymmetric scheme. Dequantized weight:
w[n, k] = (q[n, k] - zero_point[n, k // G]) * scale[n, k // G].

Decode (a few rows) reads a quarter of the bf16 weight bytes, which is the whole point; with so
few rows the N tiles alone do not fill the GPU, so the K range is split and the fp32 partials
summed afterwards.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from inferlab.kernels.triton_common import check_device, dot_dtype, dot_precision, dual_jit


@dual_jit
def _w4a16_kernel(
    x_ptr, w_ptr, scale_ptr, zp_ptr, out_ptr,  # x [M, K]; w int32 [N, K/8]; scale, zp [N, K/G]
    M, N, K, x_row_stride, num_groups, steps_per_split,
    GROUP_SIZE: tl.constexpr, HAS_ZP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    offs_w = tl.arange(0, BLOCK_K // 8)  # packed words per K step
    shifts = tl.arange(0, 8) * 4  # nibble j of a word holds element 8 * word + j
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    step_lo = split * steps_per_split
    step_hi = tl.minimum(step_lo + steps_per_split, K // BLOCK_K)
    for step in range(step_lo, step_hi):
        k0 = step * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * x_row_stride + offs_k[None, :],
                    mask=m_ok[:, None], other=0.0)  # [BLOCK_M, BLOCK_K]
        words = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * (K // 8) + (k0 // 8 + offs_w)[:, None],
                        mask=n_ok[None, :], other=0)  # [BLOCK_K/8, BLOCK_N]
        nibbles = (words[:, None, :] >> shifts[None, :, None]) & 0xF  # [BLOCK_K/8, 8, BLOCK_N]
        q = tl.reshape(nibbles, [BLOCK_K, BLOCK_N]) - 8  # row k0 + i holds element i
        group = k0 // GROUP_SIZE  # BLOCK_K divides GROUP_SIZE: one group per step
        scale = tl.load(scale_ptr + offs_n * num_groups + group, mask=n_ok, other=0.0)  # [BLOCK_N]
        if HAS_ZP:
            zp = tl.load(zp_ptr + offs_n * num_groups + group, mask=n_ok, other=0)
            q = q - zp[None, :].to(tl.int32)
        w = q.to(tl.float32) * scale.to(tl.float32)[None, :]  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(x.to(tl.float32).to(DOT_DTYPE), w.to(DOT_DTYPE),
                      input_precision=DOT_PRECISION)
    out = out_ptr + (split * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


def _block_k(group_size: int) -> int:
    """The largest power of two <= 128 dividing the group: each K step stays in one group."""
    return math.gcd(group_size, 128)


def _num_splits(m_tiles: int, n_tiles: int, k_steps: int, device: torch.device,
                requested: int | None) -> int:
    if requested is not None:
        return max(1, min(requested, k_steps))
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(k_steps, math.ceil(2 * sms / (m_tiles * n_tiles))))


def w4a16_linear(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                 group_size: int, bias: torch.Tensor | None = None,
                 weight_zero_point: torch.Tensor | None = None, *,
                 split_k: int | None = None) -> torch.Tensor:
    """x [..., K] (fp16/bf16/fp32) @ dequant(weight)^T -> [..., N] in x.dtype.

    group_size: inputs per scale (K for per-channel). split_k: a tuning knob (None picks).
    """
    device = check_device(x, weight_packed, weight_scale)
    n, k = weight_packed.shape[0], weight_packed.shape[1] * 8
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} inputs, the packed weight {k}")
    if group_size % 16 or k % group_size or weight_scale.shape != (n, k // group_size):
        raise ValueError(f"group size {group_size} must be a multiple of 16 dividing K={k}, "
                         f"with weight_scale [N, K/G] = {(n, k // max(group_size, 1))}, "
                         f"got {tuple(weight_scale.shape)}")
    if weight_zero_point is not None and weight_zero_point.shape != weight_scale.shape:
        raise ValueError("weight_zero_point must have weight_scale's shape [N, K/G]")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    block_m = 16 if m <= 16 else 64
    block_n = 64 if m <= 16 else 128
    block_k = _block_k(group_size)
    m_tiles, n_tiles, k_steps = triton.cdiv(m, block_m), triton.cdiv(n, block_n), k // block_k
    splits = _num_splits(m_tiles, n_tiles, k_steps, device, split_k) if m <= 16 else 1
    steps_per_split = triton.cdiv(k_steps, splits)
    partial = x2.new_empty(splits, m, n, dtype=torch.float32)  # [S, M, N]
    zp = weight_zero_point if weight_zero_point is not None else weight_scale
    _w4a16_kernel.on(device)[(m_tiles, n_tiles, splits)](
        x2, weight_packed.contiguous(), weight_scale.contiguous(), zp.contiguous(), partial,
        m, n, k, x2.stride(0), k // group_size, steps_per_split,
        GROUP_SIZE=group_size, HAS_ZP=weight_zero_point is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_DTYPE=dot_dtype(x.dtype, device),
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=4 if m <= 16 else 8,  # 8: a 64x128x128 tile without register spills on sm_90
    )
    out = partial[0] if splits == 1 else partial.sum(0)  # [M, N] fp32
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
