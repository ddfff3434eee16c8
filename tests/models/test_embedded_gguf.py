"""The embedded SmolLM2 GGUF: our dequantization and forward equal transformers' on the same file."""

from __future__ import annotations

import torch

from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "Les chats sont",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1905, Albert Einstein published",
]


def _prefill_logits(loaded, ids_list: list[list[int]]) -> list[torch.Tensor]:
    cfg = loaded.config
    block_size = 16
    tables, next_block = [], 0
    for ids in ids_list:
        n = -(-len(ids) // block_size)
        tables.append(list(range(next_block, next_block + n))[::-1])  # reversed: non-contiguous order
        next_block += n
    shape = (next_block, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    lens = [len(i) for i in ids_list]
    meta = AttentionMetadata.build(lens, lens, tables, block_size)
    _, positions = token_positions(lens, lens)
    flat = torch.tensor([t for ids in ids_list for t in ids])
    with torch.no_grad():
        logits = loaded.model.compute_logits(loaded.model(flat, positions, caches, meta))
    return list(logits.split(lens))


def test_fp32_logits_match_transformers_on_the_same_gguf(smollm_fp32, hf_smollm):
    ids_list = [smollm_fp32.tokenizer.encode(p) for p in PROMPTS]
    ours = _prefill_logits(smollm_fp32, ids_list)
    for ids, got in zip(ids_list, ours, strict=True):
        with torch.no_grad():
            expected = hf_smollm(torch.tensor([ids])).logits[0]
        assert (got - expected).abs().max().item() < 1e-3


def test_config_read_from_gguf_metadata(smollm_fp32):
    cfg = smollm_fp32.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert (cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings) == (64, 49152, True)
    assert cfg.rope_theta == 100000.0
