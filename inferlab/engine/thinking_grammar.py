"""A guide that starts after a reasoning model's thinking, as vLLM's structured outputs do with a
reasoning parser: free text up to and through a marker (`</think>`), up to MAX_GAP whitespace
characters (R1 writes "</think>\\n\\n"), then the inner grammar. The output may end anywhere in
the thinking, as an unguided one may; after the marker, only where the inner grammar does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from inferlab.engine.grammar import Grammar

MAX_GAP = 4  # whitespace characters between the thinking and the answer
_SPACE = " \t\r\n"


class AfterThinking(Grammar):
    """States: ("think", k), k characters of the marker matched; ("gap", n), n whitespace
    characters after it; ("answer", the inner grammar's state)."""

    def __init__(self, inner: Grammar, marker: str) -> None:
        super().__init__()
        self.inner = inner
        self.marker = marker
        self.start = ("think", 0)
        self._marker_chars = frozenset(marker)

    def _next(self, state: Any, ch: str) -> Any:
        phase, value = state
        if phase == "think":
            matched = self._matched(value, ch)
            return ("gap", 0) if matched == len(self.marker) else ("think", matched)
        if phase == "gap" and ch in _SPACE and value < MAX_GAP:
            return ("gap", value + 1)
        inner = self.inner.start if phase == "gap" else value
        nxt = self.inner.step(inner, ch)
        return None if nxt is None else ("answer", nxt)

    def _matched(self, matched: int, ch: str) -> int:
        """How much of the marker the text ends with after `ch`, given that it ended with its
        first `matched` characters (the longest such prefix, as a string search keeps it)."""
        text = self.marker[:matched] + ch
        for length in range(len(text), 0, -1):
            if self.marker.startswith(text[-length:]):
                return length
        return 0

    def is_complete(self, state: Any) -> bool:
        phase, value = state
        if phase == "think":
            return True
        return self.inner.is_complete(self.inner.start if phase == "gap" else value)

    def plain_text_room(self, state: Any) -> float | None:
        phase, value = state
        return self.inner.plain_text_room(value) if phase == "answer" else None

    def char_key(self, state: Any) -> Callable[[str], Hashable] | None:
        phase, value = state
        if phase == "think":  # characters outside the marker all start the match over
            marker_chars = self._marker_chars
            return lambda ch: ch if ch in marker_chars else ""
        return self.inner.char_key(value) if phase == "answer" else None
