"""Each token's own text, as logprobs show it (vLLM's decoded_token)."""

from __future__ import annotations

import functools

from inferlab.engine.utf8_tokens import space_marker
from inferlab.models.tokenizer import TextTokenizer


class DecodedTokens:
    """vLLM's decoded_token (its convert_ids_list_to_tokens): a token decoded alone, special
    tokens kept, with the spaces its SentencePiece entry begins with, which the decoder drops
    from the front of a text ("\u2581hello" is " hello"); cached, as a token's text never
    changes. The server's TokenTexts writes these texts into its JSON."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    @functools.cached_property
    def _marker(self) -> str | None:  # read at the first logprobs asked for, not at start-up
        return space_marker(self.tokenizer)

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            entry = self.tokenizer.id_to_token(token_id)
            if self._marker is not None and entry is not None:
                missing = ((len(entry) - len(entry.lstrip(self._marker)))
                           - (len(text) - len(text.lstrip(" "))))
                text = " " * missing + text
            self._cache[token_id] = text
        return text
