"""What guided decoding's token filter asks of a grammar (JSON, regex, EBNF): a hashable state that
one character at a time moves, or kills when no allowed output begins with the text."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Any


def marker_tail(text: str, markers: Sequence[str]) -> str:
    """The longest end of `text` that one of `markers` starts with ("" if none): how much of a
    marker the text may be partway through, as a string search keeps it."""
    for length in range(min(len(text), max(map(len, markers))), 0, -1):
        if any(m.startswith(text[-length:]) for m in markers):
            return text[-length:]
    return ""


class Grammar(ABC):
    """Subclasses give `start`, `_next` (one character's move) and `is_complete`. `step`
    remembers its answers: the token filter reads thousands of tokens from one state, and tokens
    that begin alike walk the same states, so each (state, character) is worked out once."""

    start: Hashable

    def __init__(self, memo_size: int = 1 << 15) -> None:
        self._memo: dict[tuple[Hashable, str], Any] = {}
        self.memo_size = memo_size

    @abstractmethod
    def _next(self, state: Any, ch: str) -> Any:
        """The state after `ch`, None when no allowed output begins with the text."""

    @abstractmethod
    def is_complete(self, state: Any) -> bool:
        """Whether the text so far is a whole allowed output (EOS may follow)."""

    def plain_text_room(self, state: Any) -> float | None:
        """How many characters of plain text (no quote, backslash, control character or half
        surrogate) `state` takes, whichever they are: math.inf for any number, None where that
        does not hold (the token filter then reads only the other tokens, and counts these)."""
        return None

    def moving_chars(self, state: Any) -> frozenset[str] | None:
        """The characters that take `state` elsewhere, where every other character leaves it as
        it is (free text: a token without any of them is taken unread); None where that does
        not hold."""
        return None

    def char_key(self, state: Any) -> Callable[[str], Hashable] | None:
        """A key of characters such that those with equal keys take `state` to the same next
        state (the token filter then steps once per key); None: every character its own."""
        return None

    def step(self, state: Any, ch: str) -> Any:
        key = (state, ch)
        if key in self._memo:
            return self._memo[key]
        nxt = self._next(state, ch)
        if len(self._memo) >= self.memo_size:
            self._memo.clear()  # another request's states, or a long one's: start over
        self._memo[key] = nxt
        return nxt

    def advance(self, state: Any, text: str) -> Any:
        """The state after `text`, or None as soon as no allowed output begins so."""
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state
