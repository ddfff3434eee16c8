"""A guide that starts after a reasoning model's thinking, as vLLM's structured outputs do with a
reasoning parser: free text up to and through the closer (`</think>`), up to MAX_GAP whitespace
characters (R1 writes "</think>\n\n"), then the inner grammar. The output may end anywhere in
the thinking, as an unguided one may; after the closer, only where the inner grammar does.

The gap is not the answer: vLLM's guide takes every token after the closer, so its answer starts
at once; the gap is allowed only to keep the model in its habit (a model made to answer right
after `</think>` goes out of distribution), and the reasoning parser drops it from `content`
(server/reasoning.py, gap_length), so the content is what the inner grammar matched.

With an opener (Qwen3's `<think>`), thinking is optional: a reply that opens with the opener
thinks until the closer; any other is held to the inner grammar from its first character.
Without one (R1, whose prompt opened the thinking), the reply starts inside the thinking.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from inferlab.engine.guided.grammar import Grammar, marker_tail

MAX_GAP = 4  # whitespace characters between the thinking and the answer
_SPACE = " \t\r\n"


def gap_length(text: str) -> int:
    """How many of the first characters of `text` (what follows the closer) the gap takes: it
    takes whitespace greedily, up to MAX_GAP, as AfterThinking reads it."""
    return min(len(text) - len(text.lstrip(_SPACE)), MAX_GAP)


class AfterThinking(Grammar):
    """States: ("open", (k, the inner state)) while the text so far is the opener's first k
    characters (and, read as the answer, leads the inner grammar to that state, None if
    nowhere); ("think", k), k characters of the closer matched; ("gap", n), n whitespace
    characters after it; ("answer", the inner grammar's state)."""

    def __init__(self, inner: Grammar, closer: str, opener: str | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.marker = closer
        self.opener = opener
        self.start = ("think", 0) if opener is None else ("open", (0, inner.start))
        self._marker_chars = frozenset(closer)

    def _next(self, state: Any, ch: str) -> Any:
        phase, value = state
        if phase == "open":
            return self._opening(*value, ch)
        if phase == "think":
            matched = self._matched(value, ch)
            return ("gap", 0) if matched == len(self.marker) else ("think", matched)
        if phase == "gap" and ch in _SPACE and value < MAX_GAP:
            return ("gap", value + 1)
        inner = self.inner.start if phase == "gap" else value
        nxt = self.inner.step(inner, ch)
        return None if nxt is None else ("answer", nxt)

    def _opening(self, matched: int, inner: Any, ch: str) -> Any:
        """The opener whole: thinking (a grammar that could also read it as an answer is not
        asked); still its start: both readings kept; else the answer, if the grammar takes it."""
        assert self.opener is not None
        inner = None if inner is None else self.inner.step(inner, ch)
        if self.opener[matched] == ch:
            return ("think", 0) if matched + 1 == len(self.opener) else ("open", (matched + 1, inner))
        return None if inner is None else ("answer", inner)

    def _matched(self, matched: int, ch: str) -> int:
        """How much of the marker the text ends with after `ch`, given that it ended with its
        first `matched` characters."""
        return len(marker_tail(self.marker[:matched] + ch, (self.marker,)))

    def is_complete(self, state: Any) -> bool:
        phase, value = state
        if phase == "think":
            return True
        if phase == "open":  # an empty reply, or the start of the opener read as the answer
            return value[1] is not None and self.inner.is_complete(value[1])
        return self.inner.is_complete(self.inner.start if phase == "gap" else value)

    def plain_text_room(self, state: Any) -> float | None:
        phase, value = state
        return self.inner.plain_text_room(value) if phase == "answer" else None

    def moving_chars(self, state: Any) -> frozenset[str] | None:
        """Thinking with none of the closer matched: only its first character moves it."""
        return frozenset(self.marker[0]) if state == ("think", 0) else None

    def _takes_one_of(self, state: Any, lo: str, hi: str) -> bool:
        phase, value = state
        if phase == "think":  # any character goes on thinking
            return True
        if phase == "open":
            matched, inner = value
            return lo <= self.opener[matched] <= hi or (inner is not None and self.inner.takes_one_of(inner, lo, hi))
        return self.inner.takes_one_of(self.inner.start if phase == "gap" else value, lo, hi)

    def char_key(self, state: Any) -> Callable[[str], Hashable] | None:
        phase, value = state
        if phase == "think":  # characters outside the marker all start the match over
            marker_chars = self._marker_chars
            return lambda ch: ch if ch in marker_chars else ""
        return self.inner.char_key(value) if phase == "answer" else None
