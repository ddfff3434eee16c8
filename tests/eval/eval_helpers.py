"""A tiny random Llama with a character-level tokenizer, saved as a Hugging Face directory.

One token per character makes window counts hand-checkable; transformers' own forward on the
saved model is the independent reference for the perplexity and KL figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# byte-level BPE spells space and newline as these; printable ASCII stands for itself
_CHARS = ["Ċ", "Ġ", *(chr(b) for b in range(33, 127))]
CHARACTERS = "\n " + "".join(chr(b) for b in range(33, 127))  # what the tokenizer can spell
VOCAB_SIZE = 128  # model rows; the tokenizer uses the first len(_CHARS) == 96
MAX_POSITIONS = 128


def save_char_tokenizer(directory: Path, reverse: bool = False) -> None:
    """tokenizer.json: byte-level BPE without merges, so every character is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = _CHARS[::-1] if reverse else _CHARS  # reversed: same size, different ids
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": None}))


def make_char_model(directory: Path, seed: int = 0, noise: float = 0.0,
                    reverse_vocab: bool = False):
    """Save a tiny random Llama (+ tokenizer) to `directory`; return the transformers model.

    The same seed with noise > 0 gives a perturbed copy of the seed's model: every weight
    plus noise * N(0, 1), as a stand-in for a quantized version of it.
    """
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # non-trivial norms, so that code path counts
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
            if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
                param.mul_(20.0)  # sharper distributions than the init's near-uniform ones
            if noise:
                param.add_(noise * torch.randn(param.shape, generator=generator))
    model.save_pretrained(directory, safe_serialization=True)
    save_char_tokenizer(directory, reverse=reverse_vocab)
    return model


def sample_text(num_chars: int, seed: int = 0) -> str:
    """Characters the tokenizer can spell, with some structure (words, lines)."""
    generator = torch.Generator().manual_seed(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "away", "."]
    picks = torch.randint(len(words), (num_chars,), generator=generator).tolist()
    text = ""
    for i, p in enumerate(picks):
        text += words[p] + ("\n" if i % 9 == 8 else " ")
        if len(text) >= num_chars:
            break
    return text[:num_chars]


def reference_logits(model, windows: list[list[int]]) -> list[torch.Tensor]:
    """transformers' forward on each window alone: [L, vocab] fp32 each."""
    with torch.no_grad():
        return [model(torch.tensor([w])).logits[0].float() for w in windows]
