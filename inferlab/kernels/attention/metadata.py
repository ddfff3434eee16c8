"""What attention needs to know about a flat batch of tokens from many sequences."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Describes one forward pass over N new tokens belonging to B sequences.

    Sequence b's new tokens are rows query_start_loc[b]:query_start_loc[b+1] of the flat
    batch; they sit at the end of the sequence, after seq_lens[b] - query_lens[b] tokens
    already in the cache. Any mix of prefill, chunked-prefill continuation and decode.
    """

    query_start_loc: torch.Tensor  # int32 [B+1], cumulative new-token counts
    seq_lens: torch.Tensor  # int32 [B], tokens in the cache once this step's K/V are written
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [N], cache slot (block * block_size + offset) per new token
    query_lens_cpu: list[int]  # host copies, so the torch path never syncs with the device
    seq_lens_cpu: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @classmethod
    def build(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
              block_size: int, device: torch.device | str = "cpu") -> AttentionMetadata:
        """From per-sequence host lists; new tokens occupy the last query_lens[b] positions."""
        width = max((len(t) for t in block_tables), default=1) or 1
        table = torch.zeros(len(block_tables), width, dtype=torch.int32)
        for b, blocks in enumerate(block_tables):
            table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        starts = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        starts[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
        slots = []
        for q, s, blocks in zip(query_lens, seq_lens, block_tables, strict=True):
            pos = torch.arange(s - q, s)
            blk = torch.tensor(blocks, dtype=torch.int64)[pos // block_size]
            slots.append(blk * block_size + pos % block_size)
        slot_mapping = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
        return cls(
            query_start_loc=starts.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=table.to(device),
            slot_mapping=slot_mapping.to(device),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            block_size=block_size,
        )
