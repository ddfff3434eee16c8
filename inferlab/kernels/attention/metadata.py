"""What attention needs to know about a flat batch of tokens from many sequences."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

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
    # What a backend derives once per forward and reuses in every layer (e.g. gather indices).
    backend_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def decode_seqs(self) -> list[int]:
        """Sequences with exactly one new token (decodes), in batch order; derived once per
        forward, then read by every layer."""
        return [b for b, n in enumerate(self.query_lens_cpu) if n == 1]

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
        width = max(max((len(t) for t in block_tables), default=1), 1)
        table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables],
                             dtype=torch.int32).view(len(block_tables), width)
        if _decode_only(query_lens):  # every generation step: host lists beat a dozen tensor ops
            starts = torch.arange(len(query_lens) + 1, dtype=torch.int32)
            slots = torch.tensor([t[(s - 1) // block_size] * block_size + (s - 1) % block_size
                                  for t, s in zip(block_tables, seq_lens, strict=True)])
        else:
            starts = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
            starts[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
            seq_of_token, positions = token_positions(query_lens, seq_lens)
            blocks = table[seq_of_token, positions // block_size].long()  # [N]
            slots = blocks * block_size + positions % block_size
        return cls(
            query_start_loc=starts.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=table.to(device),
            slot_mapping=slots.to(device),
            query_lens_cpu=list(query_lens),
            seq_lens_cpu=list(seq_lens),
            block_size=block_size,
        )


def token_positions(query_lens: list[int], seq_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """For every new token: its sequence index and its position in that sequence, [N] int64 each."""
    if _decode_only(query_lens):
        return torch.arange(len(query_lens)), torch.tensor(seq_lens, dtype=torch.int64) - 1
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), q_lens)  # [N]
    first_position = torch.tensor(seq_lens, dtype=torch.int64) - q_lens  # [B]
    first_row = torch.cumsum(q_lens, 0) - q_lens  # [B]
    rows = torch.arange(int(q_lens.sum()))
    return seq_of_token, first_position[seq_of_token] + rows - first_row[seq_of_token]


def _decode_only(query_lens: list[int]) -> bool:
    return query_lens.count(1) == len(query_lens)
