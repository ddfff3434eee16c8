"""Triton paged attention for a mixed batch: decode tokens and prefill chunks in one launch.

Same contract as the torch reference (`torch_paged.paged_attention`): write the new K/V into
the paged cache, then every new token attends causally to its own sequence's cached K/V,
read through the block table.

How the work is cut (one program = one tile x one KV head x one KV split):
- A tile is up to BLOCK_Q consecutive new tokens of ONE sequence, times the GROUP query heads
  that share the KV head, flattened into BLOCK_M rows. Packing the GQA group into rows lets a
  decode token (one query) still feed a 16-row tl.dot, and reads each K/V tile once per group.
- Sequence b's tiles are numbered from query_start_loc[b] // BLOCK_Q + b; that numbering never
  overlaps between sequences and never exceeds N // BLOCK_Q + B tiles, so the grid is known
  from N and B alone and each program finds its sequence by binary search. No host-side tile
  table means no host work per step and a launch that CUDA graphs can capture.
- Small decode batches do not fill the GPU with B x Hkv programs, so the KV range can be split
  NUM_SPLITS ways (flash-decoding); each split writes an unnormalised partial result with its
  running max and sum, and `_merge_splits` combines them.
Softmax runs online in the base-2 domain (exp2 with log2(e) folded into the scale).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.triton_cache_ops import write_kv_cache
from inferlab.kernels.triton_common import check_device, dot_dtype, dot_precision, dual_jit

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 16


@dual_jit
def _paged_attention_kernel(
    q_ptr, out_ptr,  # [N, Hq, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D] contiguous
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,  # int32 [B, W], [B], [B+1]
    part_acc_ptr, part_m_ptr, part_l_ptr,  # fp32 [S, N, Hq, D], [S, N, Hq], [S, N, Hq] (S > 1)
    qk_scale,  # softmax scale * log2(e)
    num_seqs,
    q_tok_stride, q_head_stride, o_tok_stride, o_head_stride, bt_stride,
    num_tokens, num_q_heads,
    NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Binary search: the last sequence whose first tile number is <= tile.
    lo = tile * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid
        else:
            hi = mid
    seq = lo
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_Q + seq)
    if local_tile * BLOCK_Q >= q_len:
        return  # a gap in the tile numbering: nothing to do
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # tokens cached before this step's queries

    offs_m = tl.arange(0, BLOCK_M)
    tok_in_tile = offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    q_idx = local_tile * BLOCK_Q + tok_in_tile  # index among the sequence's new tokens
    row_ok = (tok_in_tile < BLOCK_Q) & (q_idx < q_len) & (head_in_group < GROUP)
    q_head = kv_head * GROUP + head_in_group
    query_pos = context_len + q_idx  # absolute position: attends to keys 0..query_pos
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM

    q_rows = (q_start + q_idx).to(tl.int64) * q_tok_stride + q_head * q_head_stride
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, D]
    q = q.to(tl.float32).to(DOT_DTYPE)

    # Keys this tile needs: up to its last query's position; this split takes one slice of them.
    last_q = tl.minimum((local_tile + 1) * BLOCK_Q, q_len)
    kv_len = context_len + last_q
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_lo = split * chunk
    kv_hi = tl.minimum(kv_lo + chunk, kv_len)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    slot_stride = NUM_KV_HEADS * HEAD_DIM
    for start in range(kv_lo, kv_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_hi
        block = tl.load(block_tables_ptr + seq * bt_stride + offs_n // BLOCK_SIZE, mask=n_ok, other=0)
        kv_rows = ((block.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE) * slot_stride
                   + kv_head * HEAD_DIM)  # [BLOCK_N]
        kt = tl.load(k_cache_ptr + kv_rows[None, :] + offs_d[:, None],
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D, BLOCK_N]
        s = tl.dot(q, kt.to(tl.float32).to(DOT_DTYPE),
                   input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        visible = (offs_n[None, :] <= query_pos[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps max -inf; shift it by 0 instead.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(tl.float32).to(DOT_DTYPE),
                                            input_precision=DOT_PRECISION)
        m_i = m_new

    tok = (q_start + q_idx).to(tl.int64)
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = tok * o_tok_stride + q_head * o_head_stride
        tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        part_row = (split * num_tokens + tok) * num_q_heads + q_head  # [BLOCK_M]
        tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(part_m_ptr + part_row, m_i, mask=row_ok)
        tl.store(part_l_ptr + part_row, l_i, mask=row_ok)


def _merge_splits(acc: torch.Tensor, m: torch.Tensor, denom: torch.Tensor,
                  out: torch.Tensor) -> None:
    """Combine per-split partials: acc [S, N, Hq, D], m (base-2 max), denom [S, N, Hq] -> out."""
    m_max = m.max(0).values  # [N, Hq]; finite: every token sees at least its own key
    w = torch.exp2(m - m_max)  # [S, N, Hq]; empty splits have m = -inf -> weight 0
    total = (w * denom).sum(0)  # [N, Hq]
    merged = (w.unsqueeze(-1) * acc).sum(0) / total.unsqueeze(-1)  # [N, Hq, D]
    out.copy_(merged)


def _block_n(dtype: torch.dtype, device: torch.device, decode: bool) -> int:
    """KV positions per inner step. sm_90, 8 warps (ptxas, head dim 128): a decode tile of 128
    keys takes ~80 registers and keeps 64 KiB of K/V loads in flight; a 64-row prefill tile
    takes ~140 at 64 keys, ~200 at 128; exact fp32 dots spill above 32. The interpreter: small,
    so that the tests loop more."""
    if device.type != "cuda":
        return 16
    if dtype == torch.float32:
        return 32
    return 128 if decode else 64


def _num_kv_splits(meta: AttentionMetadata, num_kv_heads: int, device: torch.device) -> int:
    """Split the KV range only for decode batches too small to give every SM two programs."""
    if device.type != "cuda" or meta.max_query_len > 1:
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = max(1, meta.num_seqs * num_kv_heads)
    return max(1, min(_MAX_SPLITS, math.ceil(2 * sms / programs)))


def paged_attention_from_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               meta: AttentionMetadata, scale: float, *,
                               num_kv_splits: int | None = None,
                               block_n: int | None = None) -> torch.Tensor:
    """Attention only (the cache already holds this step's K/V): q [N, Hq, D] -> [N, Hq, D].

    num_kv_splits and block_n are tuning knobs (None picks them); results do not depend on them
    beyond rounding.
    """
    device = check_device(q, k_cache, v_cache, meta.block_tables, meta.seq_lens)
    n, hq, d = q.shape
    _, block_size, hkv, d_cache = k_cache.shape
    if d_cache != d or hq % hkv or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.stride(2) != 1:
        raise ValueError("the KV cache must be contiguous and q contiguous in its last dim")
    out = q.new_empty(n, hq, d)  # allocations follow q; `device` only picks the launch
    if n == 0:
        return out
    group = hq // hkv
    group_pad = triton.next_power_of_2(group)
    # Decode: one query per sequence, so one token per tile; prefill chunks: ~64 rows per tile.
    decode = meta.max_query_len == 1
    block_q = 1 if decode else max(1, 64 // group_pad)
    block_m = max(16, block_q * group_pad)
    splits = num_kv_splits or _num_kv_splits(meta, hkv, device)
    num_tiles = n // block_q + meta.num_seqs
    if splits > 1:
        # Every (split, token, head) row is written by exactly one program, even an empty split.
        part_acc = q.new_empty(splits, n, hq, d, dtype=torch.float32)
        part_m = q.new_empty(splits, n, hq, dtype=torch.float32)
        part_l = q.new_empty(splits, n, hq, dtype=torch.float32)
    else:
        part_acc = part_m = part_l = out  # never touched when NUM_SPLITS == 1
    _paged_attention_kernel.on(device)[(num_tiles, hkv, splits)](
        q, out, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        part_acc, part_m, part_l, scale * _LOG2E, meta.num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), meta.block_tables.stride(0),
        n, hq,
        NUM_KV_HEADS=hkv, BLOCK_SIZE=block_size, GROUP=group, GROUP_PAD=group_pad,
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n or _block_n(q.dtype, device, decode),
        HEAD_DIM=d, HEAD_DIM_PAD=max(16, triton.next_power_of_2(d)),
        NUM_SPLITS=splits, DOT_DTYPE=dot_dtype(q.dtype, device),
        DOT_PRECISION=dot_precision(q.dtype), num_warps=8,
    )
    if splits > 1:
        _merge_splits(part_acc, part_m, part_l, out)
    return out


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, *,
                    num_kv_splits: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """Write k, v [N, Hkv, D] at meta.slot_mapping, then attend: q [N, Hq, D] -> [N, Hq, D]."""
    write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    return paged_attention_from_cache(q, k_cache, v_cache, meta, scale,
                                      num_kv_splits=num_kv_splits, block_n=block_n)
