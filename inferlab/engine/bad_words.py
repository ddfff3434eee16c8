"""bad_words (SamplingParams) as the token id sequences the sampler bars."""

from __future__ import annotations

from inferlab.models.tokenizer import TextTokenizer


def bad_words_token_ids(tokenizer: TextTokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word as token ids, as vLLM encodes them: the word alone, and again after a space
    when that spelling starts with another token and has as many (" word" is often one token of
    its own)."""
    encoded: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        encoded.append(bare)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            encoded.append(spaced)
    return encoded
