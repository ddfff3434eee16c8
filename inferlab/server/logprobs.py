"""Engine TokenLogprobs -> the two OpenAI logprob shapes (legacy completions, chat)."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

from inferlab.engine.outputs import TokenLogprobs
from inferlab.engine.token_texts import DecodedTokens
from inferlab.engine.utf8_tokens import split_utf8, token_bytes
from inferlab.models.tokenizer import TextTokenizer
from inferlab.server.protocol import CompletionLogprobs, PromptLogprob, TokenLogprob, TopLogprob


class TokenTexts(DecodedTokens):
    """Each token's text on its own (the engine's decoded_token), and its bytes, cached."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        super().__init__(tokenizer)
        self._bytes: dict[int, list[int]] = {}

    def spelling(self, token_id: int) -> list[int]:
        """OpenAI's `bytes` of a token: what it stands for, which a token holding part of a
        character's UTF-8 bytes decodes alone only to U+FFFD."""
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = list(token_bytes(self.tokenizer, token_id, self(token_id)))
            self._bytes[token_id] = raw
        return raw


def token_id_text(token_id: int) -> str:
    """vLLM's return_tokens_as_token_ids: a token named by its id, which any tokenizer maps
    back, where its text may not (a byte fallback token alone is not valid UTF-8)."""
    return f"token_id:{token_id}"


class TextOffsets:
    """Where each token begins in a choice's text, in characters, from the bytes each token
    stands for: the tokens of one character's bytes all begin where it does (moving on by each
    one's U+FFFD ran past the text)."""

    def __init__(self, start: int = 0) -> None:
        self.chars = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def begin(self, raw: Sequence[int]) -> int:
        """The next token's offset; raw: its bytes."""
        pending = self._decoder.getstate()[0]
        if pending and raw and split_utf8(pending + bytes(raw[:1])) is None:
            # the character begun before cannot go on: its U+FFFD comes before this token
            self.chars += len(self._decoder.decode(b"", final=True))
        begins = self.chars
        self.chars += len(self._decoder.decode(bytes(raw)))
        return begins


def append_completion_logprobs(into: CompletionLogprobs, token_ids: Sequence[int],
                               entries: Sequence[TokenLogprobs | None], texts: TokenTexts,
                               offsets: TextOffsets, top_n: int,
                               names: Callable[[int], str] | None = None) -> None:
    """Add one entry per token (None entries: the first prompt token), each with its top_n, and
    its text offset. Tokens are listed by `names` where given (return_tokens_as_token_ids)."""
    names = names or texts
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = names(token_id)
        into.tokens.append(text)
        into.text_offset.append(offsets.begin(texts.spelling(token_id)))
        if entry is None:
            into.token_logprobs.append(None)
            into.top_logprobs.append(None)
            continue
        into.token_logprobs.append(entry.logprob)
        top: dict[str, float] = {}
        for t, lp in entry.top[:top_n]:  # tokens that read alike (bytes of a character, each
            top.setdefault(names(t), lp)  # "\ufffd") share a key: the likeliest keeps it
        top[text] = entry.logprob  # the chosen token is always listed, under its own logprob
        into.top_logprobs.append(top)


def prompt_logprobs(token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None],
                    texts: TokenTexts, top_n: int) -> list[dict[int, PromptLogprob] | None]:
    """vLLM's prompt_logprobs: per prompt token, its own logprob and rank, then the top_n's (in
    vLLM's order: the prompt's token first, keeping its place if it is among the top)."""
    out: list[dict[int, PromptLogprob] | None] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        if entry is None:
            out.append(None)
            continue
        ranked = {token_id: PromptLogprob(logprob=entry.logprob, rank=entry.rank,
                                          decoded_token=texts(token_id))}
        for rank, (t, lp) in enumerate(entry.top[:top_n], start=1):
            ranked[t] = PromptLogprob(logprob=lp, rank=rank, decoded_token=texts(t))
        out.append(ranked)
    return out


def chat_logprobs(entries: Sequence[TokenLogprobs], names: Callable[[int], str],
                  spellings: Callable[[int], list[int]], num_top: int) -> list[TokenLogprob]:
    """Each entry's token (as `names` gives it), logprob, bytes and top num_top."""
    out = []
    for entry in entries:
        top = [TopLogprob(token=names(t), logprob=lp, bytes=spellings(t))
               for t, lp in entry.top[:num_top]]
        out.append(TokenLogprob(token=names(entry.token_id), logprob=entry.logprob,
                                bytes=spellings(entry.token_id), top_logprobs=top))
    return out
