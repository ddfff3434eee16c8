"""Drive a model's flat forward pass with a hand-written schedule over a shuffled paged cache."""

from __future__ import annotations

import random

import torch

from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions
from inferlab.models.llama import LlamaForCausalLM

BLOCK_SIZE = 4


def run_schedule(model: LlamaForCausalLM, seqs: list[list[int]], steps: list[list[tuple[int, int]]],
                 seed: int = 0) -> list[torch.Tensor]:
    """Each step lists (sequence, new tokens); returns every position's logits per sequence [L, V].

    Block tables come from a shuffled pool, so no sequence's blocks are contiguous or in order.
    """
    cfg = model.config
    need = [-(-len(s) // BLOCK_SIZE) for s in seqs]
    pool = list(range(sum(need) + 3))
    random.Random(seed).shuffle(pool)
    tables, start = [], 0
    for n in need:
        tables.append(pool[start:start + n])
        start += n
    shape = (len(pool), BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    dtype = model.lm_head.weight.dtype
    caches = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
              for _ in range(cfg.num_layers)]
    done = [0] * len(seqs)
    logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    for step in steps:
        q_lens = [n for _, n in step]
        seq_lens = [done[i] + n for i, n in step]
        meta = AttentionMetadata.build(q_lens, seq_lens, [tables[i] for i, _ in step], BLOCK_SIZE)
        ids = [t for i, n in step for t in seqs[i][done[i]:done[i] + n]]
        _, positions = token_positions(q_lens, seq_lens)
        with torch.no_grad():
            out = model.compute_logits(model(torch.tensor(ids), positions, caches, meta))
        row = 0
        for i, n in step:
            logits[i].append(out[row:row + n])
            row += n
            done[i] += n
    assert done == [len(s) for s in seqs], "the schedule must cover every token"
    return [torch.cat(chunks) for chunks in logits]
