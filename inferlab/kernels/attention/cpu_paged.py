"""Paged attention on CPU with the C kernels: KV write, decode attention (with a shared prompt's
positions computed once for all decode tokens that share its blocks) and bf16 prefill attention
read the paged cache in place (no gathered copies); elsewhere sequences with several new tokens
go through torch's SDPA."""

from __future__ import annotations

import torch

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.attention.torch_paged import prefill_attention


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Same contract as torch_paged.paged_attention. q: [N, Hq, D]; k, v: [N, Hkv, D]."""
    cpu_ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty(q.shape, dtype=q.dtype)
    rows, seqs = decode_rows(meta)
    if rows.numel():
        cpu_ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                       rows, seqs, scale, out)
    if rows.numel() < meta.num_seqs:
        if cpu_ops.prefill_attention_fits(q, k_cache):
            cpu_ops.paged_prefill_attention(q, k_cache, v_cache, meta.block_tables,
                                            meta.query_start_loc, meta.seq_lens, prefill_seqs(meta),
                                            scale, out)
        else:
            prefill_attention(q, k_cache, v_cache, meta, scale, out)
    return out


def decode_rows(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat row and sequence index of every single-token sequence, int32 [Bd] each; the same in
    every layer of a forward, so built once (the C model forward takes them too)."""
    cached = meta.backend_cache.get("cpu_decode")
    if cached is None:
        starts = meta.query_start_loc.tolist()
        cached = (torch.tensor([starts[b] for b in meta.decode_seqs], dtype=torch.int32),
                  torch.tensor(meta.decode_seqs, dtype=torch.int32))
        meta.backend_cache["cpu_decode"] = cached
    return cached


def prefill_seqs(meta: AttentionMetadata) -> torch.Tensor:
    """Sequences with several new tokens, int32 [Bp]; built once per forward."""
    cached = meta.backend_cache.get("cpu_prefill")
    if cached is None:
        cached = torch.tensor([b for b, n in enumerate(meta.query_lens_cpu) if n > 1], dtype=torch.int32)
        meta.backend_cache["cpu_prefill"] = cached
    return cached
