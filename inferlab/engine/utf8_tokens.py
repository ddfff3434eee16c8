"""Tokens that hold part of a character's UTF-8 bytes, read for guided decoding (guided/), the
detokenizer and the server's logprobs.

A byte-level vocabulary (GPT-2's BPE, SentencePiece's byte fallback) spells a character it has
no token for in byte tokens: "\u05e2" is two tokens here, b"\\xd7" and b"\\xa2", neither of which
decodes to text alone. The grammars read characters, so a guide carries the bytes of a
character begun and not yet ended beside the grammar's state, and lets a byte token in only
where some character its bytes begin is one the grammar takes (Grammar.takes_one_of): a guide
never writes itself into a corner it cannot finish a character from.
"""

from __future__ import annotations

import codecs
import functools
import json
import re

from inferlab.models.tokenizer import TextTokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback
# lone surrogates, half a UTF-16 pair: a str may hold one (JSON's "\ud800"), UTF-8 spells none,
# so no token's text does
SURROGATE_POINTS = range(0xD800, 0xE000)
SURROGATES = re.compile(f"[{chr(SURROGATE_POINTS[0])}-{chr(SURROGATE_POINTS[-1])}]")


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """The characters a byte-level BPE (tokenizers' ByteLevel, GPT-2's) spells each byte with:
    the printable Latin-1 bytes as themselves, the other 68 as U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet = {chr(b): b for b in printable}
    others = sorted(set(range(256)) - set(printable))
    alphabet.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return alphabet


def _spelling(vocab_entry: str | None, text: str) -> bytes | None:
    """A token's bytes from its vocabulary entry: a byte fallback's hex, a byte-level token's
    alphabet, or the entry itself where it is the text (a token for U+FFFD); None for no entry
    or one spelled otherwise."""
    if vocab_entry is None:
        return None
    if (fallback := _BYTE_TOKEN.fullmatch(vocab_entry)) is not None:
        return bytes([int(fallback[1], 16)])
    alphabet = _byte_level_alphabet()
    if vocab_entry and all(ch in alphabet for ch in vocab_entry):
        return bytes(alphabet[ch] for ch in vocab_entry)
    return text.encode() if vocab_entry == text else None


def token_bytes(tokenizer: TextTokenizer, token_id: int, text: str) -> bytes:
    """The bytes token `token_id` (whose text alone is `text`) stands for: its spelling where its
    vocabulary entry gives one that decodes to `text` (a byte token's one byte, where `text` is
    U+FFFD), else `text`'s own bytes."""
    raw = _spelling(tokenizer.id_to_token(token_id), text)
    return raw if raw is not None and raw.decode("utf-8", "replace") == text else text.encode()


def space_marker(tokenizer: TextTokenizer) -> str | None:
    """The character a SentencePiece vocabulary spells a space with ("\u2581"), where the decoder
    turns it back into one (a Metaspace, or a Replace of it by " "); None for a vocabulary
    spelled otherwise. Such a decoder also drops the space a text begins with (the one
    SentencePiece puts before the first word), so a token decoded alone loses it."""
    decoder = json.loads(tokenizer.backend.to_str()).get("decoder")
    return _marker(decoder) if isinstance(decoder, dict) else None


def _marker(decoder: dict) -> str | None:
    kind = decoder.get("type")
    if kind == "Metaspace":
        return decoder.get("replacement", "\u2581")
    if kind == "Replace" and decoder.get("content") == " ":
        pattern = decoder.get("pattern", {}).get("String")
        return pattern if isinstance(pattern, str) and len(pattern) == 1 else None
    if kind == "Sequence":
        return next(filter(None, map(_marker, decoder.get("decoders", []))), None)
    return None


def byte_spellings(tokenizer: TextTokenizer, texts: list[str | None]) -> dict[int, bytes]:
    """The bytes of each token that decodes to text only beside others (appended_texts gave it no
    text), where its vocabulary entry spells them and they decode, with U+FFFD for what is not
    whole, to what the tokenizer decodes: a tokenizer spelled otherwise keeps them out."""
    specials = tokenizer.all_special_ids
    candidates = [i for i, text in enumerate(texts) if text is None and i not in specials]
    decoded = tokenizer.backend.decode_batch([[i] for i in candidates], skip_special_tokens=False)
    spellings = {}
    for token_id, text in zip(candidates, decoded, strict=True):
        raw = _spelling(tokenizer.id_to_token(token_id), text)
        if raw and raw.decode("utf-8", "replace") == text:
            spellings[token_id] = raw
    return spellings


def ends_inside_a_character(tokenizer: TextTokenizer, token_ids: list[int]) -> bool:
    """Whether the tokens' bytes end partway through a character (a reply cut inside one)."""
    return bool(unfinished_character(tokenizer, token_ids))


def unfinished_character(tokenizer: TextTokenizer, token_ids: list[int]) -> bytes:
    """The bytes of the character the tokens end partway through, b"" where they end whole: their
    last lead byte, within the last three, begins a character not ended. Read back to the last
    token whose entry spells no bytes (its text is whole); special tokens write nothing. A text
    that decodes to U+FFFD otherwise (U+FFFD itself, bytes that are no UTF-8) is what the
    tokens say."""
    raw = b""
    for token_id in reversed(token_ids):
        if token_id in tokenizer.all_special_ids:
            continue
        spelled = _spelling(tokenizer.id_to_token(token_id), tokenizer.decode([token_id], False))
        if spelled is None or len(raw) >= 3:
            break
        raw = spelled + raw
    for start in range(len(raw) - 1, max(len(raw) - 4, -1), -1):
        if raw[start] < 0x80:  # ASCII: whole
            return b""
        if raw[start] >= 0xC0:  # a lead byte
            return raw[start:] if split_utf8(raw[start:]) == ("", raw[start:]) else b""
    return b""


def split_utf8(data: bytes) -> tuple[str, bytes] | None:
    """(the whole characters `data` begins with, the bytes after them: the start of one more
    character, or b""), or None when no UTF-8 text begins with `data`."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    tail = decoder.getstate()[0]
    return (text, tail) if not tail or completions(tail) is not None else None


@functools.lru_cache(maxsize=4096)
def completions(tail: bytes) -> tuple[str, str] | None:
    """The first and last of the characters whose UTF-8 bytes begin with `tail` (one to three
    bytes, a valid start of a longer character), None if only surrogates do."""
    lead = tail[0]
    length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    point = lead & (0x7F >> length)
    for byte in tail[1:]:
        point = point << 6 | byte & 0x3F
    free_bits = 6 * (length - len(tail))
    lo, hi = point << free_bits, (point << free_bits) | ((1 << free_bits) - 1)
    lo = max(lo, (0x80, 0x800, 0x10000)[length - 2])
    hi = min(hi, (0x7FF, 0xFFFF, 0x10FFFF)[length - 2])
    if lo in SURROGATE_POINTS and hi in SURROGATE_POINTS:
        return None
    if hi in SURROGATE_POINTS:
        hi = SURROGATE_POINTS[0] - 1
    return chr(lo), chr(hi)


@functools.lru_cache(maxsize=256)
def chars_between(lo: str, hi: str) -> str:
    """Every character from lo to hi (the surrogates left out): a text a compiled pattern can
    search for one it takes, at C speed."""
    return "".join(chr(c) for c in range(ord(lo), ord(hi) + 1)
                   if c not in SURROGATE_POINTS)
