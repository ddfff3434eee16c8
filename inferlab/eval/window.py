"""Run one window of tokens through the model in a single prefill and return its logits."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions
from inferlab.models.config import ModelConfig
from inferlab.models.loader import LoadedModel


def context_unit(cfg: ModelConfig) -> str:
    """What caps cfg.max_context, for errors: the positions, or a sliding window shorter than
    them (attention here does not slide)."""
    return "positions" if cfg.max_context == cfg.max_positions else "tokens of sliding window"


class WindowRunner:
    """Owns a paged KV cache just large enough for one window, allocated once and reused.

    Each call is a fresh sequence: every token of the window is new, so the cache's old
    contents are overwritten before attention reads them and never need clearing.
    """

    def __init__(self, loaded: LoadedModel, max_len: int, dtype: torch.dtype,
                 device: torch.device, block_size: int = 16) -> None:
        cfg = loaded.config
        if max_len > cfg.max_context:
            raise ValueError(f"windows of {max_len} tokens exceed the model's {cfg.max_context} "
                             f"{context_unit(cfg)}")
        self.model = loaded.model
        self.max_len, self.block_size, self.device = max_len, block_size, device
        num_blocks = -(-max_len // block_size)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device))
                          for _ in range(cfg.num_layers)]

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """ids [L] -> fp32 logits [L, vocab]; row i is the distribution of token i+1."""
        length = len(ids)
        if not 1 <= length <= self.max_len:
            raise ValueError(f"a window of {length} tokens does not fit (1..{self.max_len})")
        table = list(range(-(-length // self.block_size)))
        meta = AttentionMetadata.build([length], [length], [table], self.block_size, self.device)
        _, positions = token_positions([length], [length])  # [L]: 0..L-1
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)  # [L]
        with torch.inference_mode():
            hidden = self.model(input_ids, positions.to(self.device), self.kv_caches, meta)
            return self.model.compute_logits(hidden)  # [L, vocab]
