"""The vocabulary as guided decoding's token filter reads it (token_filter.py): each token's
text as character ids, so that all tokens walk a grammar together; the byte tokens (each part of
a character's UTF-8 bytes, engine/utf8_tokens.py) by their bytes; and the tokens that go on any
JSON string as they are (no quote, backslash, control character or lone surrogate) by length.
Built once for an engine and shared by every grammar.
"""

from __future__ import annotations

import torch

from inferlab.engine.utf8_tokens import SURROGATES, byte_spellings, split_utf8
from inferlab.models.tokenizer import TextTokenizer


def appended_texts(tokenizer: TextTokenizer) -> list[str | None]:
    """The text each token adds to an output, None for special and empty tokens and for those
    that hold part of a character's UTF-8 bytes (utf8_tokens.byte_spellings gives their bytes).

    A token is decoded after an anchor token and the anchor's text cut off, so tokenizers that
    drop a word's leading space when it starts the text (SentencePiece) keep it here. A byte
    token decodes alone to U+FFFD: read as that one character, two or three of them that make
    one character would be counted as two or three (under [^\\x00-\\x7f]{3} the reply was one
    character), and a sequence cut short passed as a character.
    """
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1]
    anchor_text = tokenizer.decode([anchor], skip_special_tokens=False)
    size = tokenizer.vocab_size
    pairs = tokenizer.backend.decode_batch([[anchor, i] for i in range(size)], skip_special_tokens=False)
    texts: list[str | None] = []
    for token_id, text in enumerate(pairs):
        if token_id in tokenizer.all_special_ids:
            texts.append(None)
            continue
        if text.startswith(anchor_text):
            text = text[len(anchor_text):]
        else:
            text = tokenizer.decode([token_id], skip_special_tokens=False)
        texts.append(None if "\ufffd" in text else text or None)
    return texts


def token_index(tokenizer: TextTokenizer, vocab_size: int) -> TokenIndex:
    """The index of a tokenizer's vocabulary, its byte tokens with their bytes."""
    texts = appended_texts(tokenizer)
    return TokenIndex(texts, vocab_size, byte_tokens=byte_spellings(tokenizer, texts))


class TokenIndex:
    """A vocabulary's token texts as character ids, for walking them all at once through a
    grammar (TokenFilter); built once, shared by every grammar."""

    def __init__(self, texts: list[str | None], vocab_size: int, depth: int = 24,
                 byte_tokens: dict[int, bytes] | None = None) -> None:
        # one entry a row of the logits: a model may have more rows than its tokenizer has
        # tokens (never sampled here), or fewer (the extra tokens cannot be sampled)
        if depth < 1:
            raise ValueError(f"the index holds at least a token's first character, not {depth}")
        self.texts = (texts + [None] * vocab_size)[:vocab_size]
        # tokens read by their bytes (each holds part of a character): id -> bytes, ids in order
        self.spelling = {i: raw for i, raw in sorted((byte_tokens or {}).items()) if i < vocab_size}
        # those that may start a text, as (id, the whole characters, the start of one more)
        self.byte_starts = [(i, *split) for i, raw in self.spelling.items() if (split := split_utf8(raw))]
        self.depth = depth  # characters held in char_ids; a longer token's rest is read as text
        self.chars = sorted({ch for text in self.texts if text for ch in text})
        self.char_id = {ch: i for i, ch in enumerate(self.chars)}
        rows = [[self.char_id[c] for c in (text or "")[:depth]] for text in self.texts]
        self.char_ids = torch.tensor([row + [-1] * (depth - len(row)) for row in rows], dtype=torch.int32)  # [V, depth]
        self.lengths = torch.tensor([len(text or "") for text in self.texts], dtype=torch.int64)  # [V]
        token_ids = [i for i, text in enumerate(self.texts) if text]
        self.token_ids = torch.tensor(token_ids, dtype=torch.int64)
        # the tokens longer than char_ids holds, as (their row in token_ids, their id)
        self.long_tokens = [(row, i) for row, i in enumerate(token_ids) if len(self.texts[i]) > depth]
        # tokens that continue any string as they are, shortest first, and their lengths
        unsafe = [i for i in token_ids if _string_unsafe(self.texts[i])]
        safe = sorted(set(token_ids) - set(unsafe), key=lambda i: len(self.texts[i]))
        self.string_safe = torch.tensor(safe, dtype=torch.int64)
        self.string_safe_lengths = [len(self.texts[i]) for i in safe]
        # every token, and the string-unsafe ones, split by their first character
        self.all_tokens = self.split(self.token_ids, 0)
        self.string_unsafe = self.split(torch.tensor(unsafe, dtype=torch.int64), 0)

    def partition(self, chars: frozenset[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the tokens without any of `chars`, the tokens with some)."""
        ids = torch.tensor([self.char_id[c] for c in chars if c in self.char_id], dtype=torch.int32)
        holds = torch.isin(self.char_ids[self.token_ids], ids).any(dim=1)  # [tokens]
        for row, i in self.long_tokens:  # what char_ids does not hold of them
            if not chars.isdisjoint(self.texts[i][self.depth:]):
                holds[row] = True
        return self.token_ids[~holds], self.token_ids[holds]

    def split(self, ids: torch.Tensor, depth: int) -> list[tuple[str, torch.Tensor]]:
        """`ids` (all longer than `depth` characters) by their character at `depth`."""
        chars, order = torch.sort(self.char_ids[ids, depth])
        values, counts = torch.unique_consecutive(chars, return_counts=True)
        return [(self.chars[c], part) for c, part in zip(values.tolist(), torch.split(ids[order], counts.tolist()),
                                                          strict=True)]


def _string_unsafe(text: str) -> bool:
    return '"' in text or "\\" in text or min(text) < " " or SURROGATES.search(text) is not None
