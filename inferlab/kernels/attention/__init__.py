"""Paged attention behind one signature, so a GPU kernel can replace the torch path.

paged_attention(q [N,Hq,D], k [N,Hkv,D], v [N,Hkv,D], k_cache, v_cache, meta, scale) -> [N,Hq,D]
writes the new K/V into the caches at meta.slot_mapping, then attends each new token causally over
its sequence's cached K/V, read through meta.block_tables.
"""

from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.attention.torch_paged import paged_attention

__all__ = ["AttentionMetadata", "paged_attention"]
