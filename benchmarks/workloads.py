"""Shared by the benchmark scripts: prompts cut from WikiText-2 and this machine's roofline."""

from __future__ import annotations

import sys
from pathlib import Path

WIKITEXT = Path(__file__).resolve().parent.parent.parent / "shared/data/wikitext-2-raw/wiki.test.raw"


def wikitext_prompts(tokenizer, count: int, tokens: int, offset: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `tokens` token ids, consecutive slices of the test text."""
    if not WIKITEXT.is_file():
        sys.exit(f"{WIKITEXT} is absent: the benchmarks read the shared WikiText-2 test text")
    ids = tokenizer.encode(WIKITEXT.read_text(encoding="utf-8")[: 12 * (count * tokens + offset) + 10_000],
                           add_special_tokens=False)
    ids = ids[offset:]
    if len(ids) < count * tokens:
        sys.exit(f"not enough text for {count} prompts of {tokens} tokens")
    return [ids[i * tokens:(i + 1) * tokens] for i in range(count)]


def machine_roofline() -> dict:
    """Measured memory bandwidth (bytes/s) and matmul peaks (FLOP/s) of this machine, now."""
    from inferlab.planner.measure import measure_cpu

    return measure_cpu(repeats=3)


def bytes_read_per_decode_step(model) -> int:
    """Bytes of the weights one decode step reads: every linear layer and norm (the embedding
    and RoPE tables are only indexed, a few rows per step)."""
    total = 0
    for name, module in model.named_modules():
        if name.endswith(("embed_tokens", "rotary")):
            continue
        for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            total += tensor.numel() * tensor.element_size() if tensor is not None else 0
    return total


def prefill_flops_per_token(cfg, prompt_tokens: int) -> float:
    """Matmul FLOPs per token of a prompt's prefill: 2 per weight of the decoder layers, and the
    lm_head's 2 per weight once per prompt (logits only for its last token). The embedding
    lookup is none; attention's products are left out."""
    lm_head = cfg.vocab_size * cfg.hidden_size
    lookup = 0 if cfg.tie_word_embeddings else lm_head
    return 2 * (cfg.num_parameters() - lookup - lm_head) + 2 * lm_head / prompt_tokens
