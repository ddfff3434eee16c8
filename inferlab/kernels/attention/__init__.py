"""Paged attention behind one signature, so a GPU kernel can replace the torch path.

paged_attention(q [N,Hq,D], k [N,Hkv,D], v [N,Hkv,D], k_cache, v_cache, meta, scale) -> [N,Hq,D]
writes the new K/V into the caches at meta.slot_mapping, then attends each new token causally over
its sequence's cached K/V, read through meta.block_tables. CUDA tensors take the Triton kernel,
CPU tensors the C kernels where they are built, everything else the torch path (also the oracle
the kernels are tested against).
"""

from __future__ import annotations

import torch

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention import cpu_paged, torch_paged
from inferlab.kernels.attention.metadata import AttentionMetadata


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    if q.is_cuda:
        from inferlab.kernels.attention import triton_paged

        return triton_paged.paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    if cpu_ops.available(q, k_cache):
        return cpu_paged.paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    return torch_paged.paged_attention(q, k, v, k_cache, v_cache, meta, scale)


__all__ = ["AttentionMetadata", "paged_attention"]
