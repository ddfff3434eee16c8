"""Shared by the benchmark scripts: prompts cut from WikiText-2 and this machine's roofline."""

from __future__ import annotations

import sys
from pathlib import Path

WIKITEXT = Path(__file__).resolve().parent.parent.parent / "shared/data/wikitext-2-raw/wiki.test.raw"


def wikitext_prompts(tokenizer, count: int, tokens: int, offset: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `tokens` token ids, consecutive slices of the test text."""
    if not WIKITEXT.is_file():
        sys.exit(f"{WIKITEXT} is absent: the benchmarks read the shared WikiText-2 test text")
    ids = tokenizer.encode(WIKITEXT.read_text(encoding="utf-8")[: 12 * count * tokens + 10_000],
                           add_special_tokens=False)
    ids = ids[offset:]
    if len(ids) < count * tokens:
        sys.exit(f"not enough text for {count} prompts of {tokens} tokens")
    return [ids[i * tokens:(i + 1) * tokens] for i in range(count)]


def machine_roofline() -> dict:
    """Measured memory bandwidth (bytes/s) and matmul peaks (FLOP/s) of this machine, now."""
    from inferlab.planner.measure import measure_cpu

    return measure_cpu(repeats=3)


def weight_bytes(model) -> int:
    """Bytes of every parameter and buffer the forward pass reads (tied weights once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
