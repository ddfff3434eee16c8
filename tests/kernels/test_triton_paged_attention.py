"""Triton paged attention and KV-cache write, run on CPU through the Triton interpreter.

The oracle is a dense causal attention over each sequence's full K/V, computed in float64
straight from the per-sequence tensors (no pages, no slots), plus the lead's torch paged
reference where it exists. Block tables are shuffled so pages are not in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from inferlab.kernels.attention.metadata import AttentionMetadata  # noqa: E402
from inferlab.kernels.attention.triton_paged import paged_attention  # noqa: E402
from inferlab.kernels.triton_cache_ops import write_kv_cache  # noqa: E402

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
# CPU runs the kernels in the interpreter; where a GPU exists they also run compiled (-m gpu)
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@dataclass
class Batch:
    q: torch.Tensor  # [N, Hq, D] new queries
    k: torch.Tensor  # [N, Hkv, D] new keys (written by the kernel)
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D], context already written
    v_cache: torch.Tensor
    meta: AttentionMetadata
    full_k: list[torch.Tensor]  # per sequence [seq_len, Hkv, D]: context + new, in order
    full_v: list[torch.Tensor]

    def to(self, device: str) -> Batch:
        meta = AttentionMetadata.build(self.meta.query_lens_cpu, self.meta.seq_lens_cpu,
                                       self.meta.block_tables.tolist(), self.meta.block_size, device)
        return Batch(self.q.to(device), self.k.to(device), self.v.to(device),
                     self.k_cache.to(device), self.v_cache.to(device), meta, self.full_k, self.full_v)


def make_batch(query_lens: list[int], context_lens: list[int], num_heads: int, num_kv_heads: int,
               head_dim: int, block_size: int = 4, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    pages = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(pages) + 3  # spare blocks stay garbage: reading them would show
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for p in pages:
        tables.append(order[used:used + p])
        used += p
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    full_k, full_v = [], []
    for s, table in zip(seq_lens, tables, strict=True):
        kk = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        vv = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        full_k.append(kk)
        full_v.append(vv)
        for pos in range(s):  # the cache holds the context; new positions hold garbage for now
            blk, off = table[pos // block_size], pos % block_size
            if pos < s - query_lens[len(full_k) - 1]:
                k_cache[blk, off], v_cache[blk, off] = kk[pos], vv[pos]
    n = sum(query_lens)
    q = torch.randn(n, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.cat([kk[-ql:] for kk, ql in zip(full_k, query_lens, strict=True)])
    v = torch.cat([vv[-ql:] for vv, ql in zip(full_v, query_lens, strict=True)])
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    return Batch(q, k, v, k_cache, v_cache, meta, full_k, full_v)


def dense_attention(batch: Batch, scale: float) -> torch.Tensor:
    """Causal softmax attention per sequence in float64, GQA by repeating KV heads."""
    outs, start = [], 0
    group = batch.q.shape[1] // batch.full_k[0].shape[1]
    for ql, kk, vv in zip(batch.meta.query_lens_cpu, batch.full_k, batch.full_v, strict=True):
        q = batch.q[start:start + ql].cpu().double()  # [ql, Hq, D]
        k = kk.double().repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = vv.double().repeat_interleave(group, dim=1)
        s = kk.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # [Hq, ql, S]
        q_pos = torch.arange(s - ql, s)[:, None]
        scores = scores.masked_fill(torch.arange(s)[None, :] > q_pos, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        start += ql
    return torch.cat(outs)


MIXED = ([1, 5, 1, 7], [9, 0, 2, 6])  # decodes, a fresh prefill, a chunk continuing a prefill


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("group", "head_dim"), [(1, 64), (3, 64), (4, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_batch_matches_dense_attention(group: int, head_dim: int, dtype: torch.dtype,
                                             device: str) -> None:
    batch = make_batch(*MIXED, num_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
                       dtype=dtype).to(device)
    scale = head_dim ** -0.5
    out = paged_attention(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache,
                          batch.meta, scale)
    assert out.shape == batch.q.shape and out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), dense_attention(batch, scale),
                               atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [2, 5])
def test_kv_splits_match_dense_attention(splits: int, device: str) -> None:
    """Split-KV (flash-decoding) partials merge to the same answer, empty splits included."""
    batch = make_batch([1, 1, 3], [20, 2, 11], num_heads=4, num_kv_heads=1, head_dim=64,
                       dtype=torch.float16, seed=1).to(device)
    out = paged_attention(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache,
                          batch.meta, 0.125, num_kv_splits=splits)
    torch.testing.assert_close(out.cpu().double(), dense_attention(batch, 0.125), atol=2e-3,
                               rtol=2e-3)


def test_long_prefill_spans_several_query_tiles() -> None:
    """More new tokens than one tile holds: later tiles see earlier tiles' keys."""
    batch = make_batch([40, 1], [3, 30], num_heads=1, num_kv_heads=1, head_dim=64, block_size=8,
                       seed=2)
    out = paged_attention(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache,
                          batch.meta, 0.1, block_n=32)
    torch.testing.assert_close(out.double(), dense_attention(batch, 0.1), atol=2e-5, rtol=2e-5)


def test_query_as_strided_slice_of_fused_projection() -> None:
    """q, k, v sliced out of one qkv tensor (rows not contiguous) give the same result."""
    batch = make_batch(*MIXED, num_heads=3, num_kv_heads=1, head_dim=64, seed=3)
    qkv = torch.cat([batch.q, batch.k, batch.v], dim=1)  # [N, 5, D]
    q, k, v = qkv[:, :3], qkv[:, 3:4], qkv[:, 4:]
    out = paged_attention(q, k, v, batch.k_cache, batch.v_cache, batch.meta, 0.125)
    torch.testing.assert_close(out.double(), dense_attention(batch, 0.125), atol=2e-5, rtol=2e-5)


def test_cache_write_puts_each_token_at_its_slot() -> None:
    batch = make_batch(*MIXED, num_heads=2, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16)
    write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)
    for seq, table in enumerate(batch.meta.block_tables.tolist()):
        for pos in range(batch.meta.seq_lens_cpu[seq]):
            blk, off = table[pos // 4], pos % 4
            assert torch.equal(batch.k_cache[blk, off], batch.full_k[seq][pos])
            assert torch.equal(batch.v_cache[blk, off], batch.full_v[seq][pos])


def test_cache_write_skips_negative_slots() -> None:
    """Padding tokens (slot -1) write nothing; the real token still lands at its slot."""
    k_cache = torch.zeros(2, 4, 1, 16)
    v_cache = torch.zeros(2, 4, 1, 16)
    k = torch.arange(32, dtype=torch.float32).reshape(2, 1, 16) + 1
    write_kv_cache(k, -k, k_cache, v_cache, torch.tensor([-1, 6]))
    assert torch.equal(k_cache[1, 2, 0], k[1, 0]) and torch.equal(v_cache[1, 2, 0], -k[1, 0])
    assert k_cache.count_nonzero() == 16 and v_cache.count_nonzero() == 16


def test_matches_torch_reference() -> None:
    torch_paged = pytest.importorskip("inferlab.kernels.attention.torch_paged")
    batch = make_batch(*MIXED, num_heads=4, num_kv_heads=1, head_dim=64, dtype=torch.float16,
                       seed=4)
    k_ref, v_ref = batch.k_cache.clone(), batch.v_cache.clone()
    expected = torch_paged.paged_attention(batch.q, batch.k, batch.v, k_ref, v_ref, batch.meta,
                                           0.125)
    out = paged_attention(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache,
                          batch.meta, 0.125)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
    assert torch.equal(batch.k_cache, k_ref) and torch.equal(batch.v_cache, v_ref)
