"""Paged attention in plain torch: the CPU path, and the oracle other kernels are tested against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.kernels.attention.metadata import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V at their slots. k, v: [N, Hkv, D]; caches: [blocks, block_size, Hkv, D].
    A negative slot (a padding row) writes nothing."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    keep = slot_mapping >= 0
    k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write this step's K/V, then attend every new token over its sequence's cache.

    q: [N, Hq, D]; k, v: [N, Hkv, D]. Returns [N, Hq, D].
    """
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty_like(q)
    if meta.decode_seqs:
        _decode(q, k_cache, v_cache, meta, scale, meta.decode_seqs, out)
    if len(meta.decode_seqs) < meta.num_seqs:
        prefill_attention(q, k_cache, v_cache, meta, scale, out)
    return out


@dataclass
class _DecodePlan:
    """Gather indices for the single-token sequences, the same in every layer of a forward."""

    token_idx: torch.Tensor  # [Bd] flat row of each decode token
    tables: torch.Tensor  # [Bd, nb] their blocks
    valid: torch.Tensor  # [Bd, 1, 1, L] bool: key position < sequence length
    max_len: int


def _decode_plan(meta: AttentionMetadata, seqs: list[int], block_size: int) -> _DecodePlan:
    plan = meta.backend_cache.get("torch_decode")
    if plan is None:
        device = meta.seq_lens.device
        seqs_t = torch.tensor(seqs, device=device)
        max_len = max(meta.seq_lens_cpu[b] for b in seqs)
        lens = meta.seq_lens[seqs_t].unsqueeze(1)  # [Bd, 1]
        plan = _DecodePlan(
            token_idx=meta.query_start_loc[seqs_t].long(),
            tables=meta.block_tables[seqs_t, : -(-max_len // block_size)].long(),
            valid=(torch.arange(max_len, device=device).unsqueeze(0) < lens)[:, None, None, :],
            max_len=max_len,
        )
        meta.backend_cache["torch_decode"] = plan
    return plan


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            meta: AttentionMetadata, scale: float, seqs: list[int], out: torch.Tensor) -> None:
    """All single-token sequences at once: one gather of their blocks, one masked SDPA."""
    plan = _decode_plan(meta, seqs, k_cache.shape[1])
    keys = k_cache[plan.tables].flatten(1, 2)[:, :plan.max_len]  # [Bd, L, Hkv, D]
    values = v_cache[plan.tables].flatten(1, 2)[:, :plan.max_len]
    only_decodes = len(seqs) == q.shape[0]  # then each sequence is one token, in order: no gather
    attn = F.scaled_dot_product_attention(
        (q if only_decodes else q[plan.token_idx]).unsqueeze(2).to(keys.dtype),  # [Bd, Hq, 1, D]
        keys.transpose(1, 2), values.transpose(1, 2),  # [Bd, Hkv, L, D]
        attn_mask=plan.valid, scale=scale, enable_gqa=True,
    ).squeeze(2)  # [Bd, Hq, D]
    if only_decodes:
        out.copy_(attn)
    else:
        out[plan.token_idx] = attn.to(out.dtype)


@dataclass
class _PrefillSeq:
    """A sequence with several new tokens, as every layer of a forward attends it."""

    start: int  # its first row in q
    end: int
    seq_len: int
    blocks: torch.Tensor  # [nb] int64, its blocks in order
    mask: torch.Tensor | None  # [q_len, seq_len], 0 or -inf; None: causal from position 0


def _prefill_plan(meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> list[_PrefillSeq]:
    """Built once a forward: the masks and block ids are the same in every layer, and a bool
    mask SDPA turns into an additive one at each call (on fp32 CPU steps, building and turning
    the masks cost a third of the attention)."""
    plan = meta.backend_cache.get("torch_prefill")
    if plan is None:
        plan, start = [], 0
        device = meta.block_tables.device
        for b, (q_len, seq_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
            if q_len > 1:
                context, mask = seq_len - q_len, None
                if context:  # new token i sees cache positions <= context + i
                    seen = (torch.arange(seq_len, device=device)[None, :]
                            <= context + torch.arange(q_len, device=device)[:, None])
                    mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, -torch.inf)
                blocks = meta.block_tables[b, : -(-seq_len // block_size)].long()
                plan.append(_PrefillSeq(start, start + q_len, seq_len, blocks, mask))
            start += q_len
        meta.backend_cache["torch_prefill"] = plan
    return plan


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      meta: AttentionMetadata, scale: float, out: torch.Tensor) -> None:
    """Sequences with several new tokens, one at a time: causal over cache + new tokens."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    for seq in _prefill_plan(meta, k_cache.shape[1], k_cache.dtype):
        # index_select copies whole blocks; indexing (aten::index) went element by element
        keys = k_cache.index_select(0, seq.blocks).view(-1, num_kv_heads, head_dim)[:seq.seq_len]  # [S, Hkv, D]
        values = v_cache.index_select(0, seq.blocks).view(-1, num_kv_heads, head_dim)[:seq.seq_len]
        attn = F.scaled_dot_product_attention(
            q[seq.start:seq.end].transpose(0, 1).unsqueeze(0).to(keys.dtype),  # [1, Hq, q_len, D]
            keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
            attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True,
        )  # [1, Hq, q_len, D]
        out[seq.start:seq.end] = attn[0].transpose(0, 1).to(out.dtype)
