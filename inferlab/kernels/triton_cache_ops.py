"""Triton KV-cache write: new keys and values go to their slots in the paged cache.

Slot s is row s of the cache seen as [num_blocks * block_size, num_kv_heads, head_dim].
A negative slot means "padding token, write nothing" (CUDA-graph batches are padded so
their shapes stay fixed; the padded rows must not overwrite real cache entries).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.kernels.triton_common import check_device, dual_jit


@dual_jit
def _write_kv_kernel(
    k_ptr, v_ptr,  # [N, Hkv, D], rows may be strided
    k_cache_ptr, v_cache_ptr,  # [num_slots, Hkv, D] contiguous
    slot_ptr,  # int64 [N]
    k_row_stride, v_row_stride,
    ROW: tl.constexpr,  # Hkv * D elements per token
    BLOCK: tl.constexpr,  # power of two >= ROW
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    offs = tl.arange(0, BLOCK)
    mask = (offs < ROW) & (offs * 0 + slot >= 0)  # broadcast first: the interpreter needs it
    k = tl.load(k_ptr + token * k_row_stride + offs, mask=mask)
    v = tl.load(v_ptr + token * v_row_stride + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k, v [N, Hkv, D] -> k_cache, v_cache [num_blocks, block_size, Hkv, D] at slot_mapping [N]."""
    device = check_device(k, v, k_cache, v_cache, slot_mapping)
    n, hkv, d = k.shape
    if n == 0:
        return
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV cache must be contiguous")
    if k_cache.shape[-2:] != (hkv, d) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)}, v {tuple(v.shape)} do not fit the cache "
                         f"{tuple(k_cache.shape)}")
    # Each token's heads must be one contiguous run; the token stride itself may be anything
    # (k and v are often column slices of one fused qkv projection).
    k = k if k[0].is_contiguous() else k.contiguous()
    v = v if v[0].is_contiguous() else v.contiguous()
    row = hkv * d
    _write_kv_kernel.on(device)[(n,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )
