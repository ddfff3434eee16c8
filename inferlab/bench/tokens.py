"""Token counting for the benchmark: the `tokenizers` library, or an honest estimate.

The benchmark is a client; it never loads the model's code. With `--tokenizer PATH`
(a tokenizer.json) it cuts synthetic prompts to exact token counts and cross-checks
the servers' output token counts. Without one, lengths are estimated from words and
the report says so.
"""

from __future__ import annotations

from pathlib import Path

from inferlab.bench.tags import tagged
from inferlab.errors import InferlabError

WORDS_PER_TOKEN = 0.75  # the usual rule of thumb for English BPE vocabularies
# without a tokenizer, what a request's tag "[0000001-00-123456] " is guessed to cost: 19
# tokens where every digit is one, 10 where digits go in threes
TAG_TOKENS_ESTIMATE = 16


class TokenCounter:
    """Wraps a tokenizers.Tokenizer; `None` tokenizer means word-based estimates."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else str(path)
        self.tokenizer = None
        if path is not None:
            from tokenizers import Tokenizer  # imported here: only runs that ask pay for it

            try:
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as e:  # the library raises a bare Exception on a bad file
                raise InferlabError(f"cannot load tokenizer {path}: {e}") from None

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return estimate_tokens(text)
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_tagged(self, text: str, at: int = 0) -> int:
        """Tokens in `text` once a request's unique tag is put in at character `at`: exact
        with a tokenizer (every tag of a run costs the same, see tags.py), else estimated."""
        if self.tokenizer is None:
            return estimate_tokens(text) + TAG_TOKENS_ESTIMATE
        return self.count(tagged(text, at))

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise InferlabError("exact token ids need --tokenizer")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise InferlabError("decoding token ids needs --tokenizer")
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def estimate_tokens(text: str) -> int:
    """Tokens in `text` by the word rule of thumb (at least 1 for non-empty text)."""
    words = len(text.split())
    return max(1 if text.strip() else 0, round(words / WORDS_PER_TOKEN))


def words_for_tokens(tokens: int) -> int:
    return max(1, round(tokens * WORDS_PER_TOKEN))
