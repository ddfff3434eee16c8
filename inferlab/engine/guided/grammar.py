"""What guided decoding's token filter asks of a grammar (JSON, regex, EBNF): a hashable state that
one character at a time moves, or kills when no allowed output begins with the text; and, for
tokens that hold part of a character (engine/utf8_tokens.py), whether some character of a range
moves it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from inferlab.engine.utf8_tokens import completions, split_utf8
from inferlab.errors import GuidedDecodingError

# Readings of the text a state may hold (a JSON schema's or an EBNF grammar's stacks). An
# ambiguous grammar that nests ('r ::= "a" r "x" | "a" r "y" | "z"', a recursive anyOf of two
# alike branches) doubles them with every character: 2^18 took 17 s and 2.9 GB of the engine
# thread, which every request waits on. A text past this many raises GuidedDecodingError, and
# the token filter offers no token that leads there. Legit schemas come near: an anyOf of
# objects that all begin with a number reads it two ways each (256 cut 129 objects' digits), a
# union nested in a union multiplies. A mask's cost grows with the readings: steered along 1,024,
# a forced ambiguous reply took 0.25 s a token, which every stream waited.
MAX_READINGS = 1024
_TOO_AMBIGUOUS = object()  # a step's remembered answer: past MAX_READINGS


def bounded_state(stacks: set[tuple]) -> frozenset[tuple] | None:
    """The state of `stacks`, None when there are none; raises GuidedDecodingError past
    MAX_READINGS of them."""
    if len(stacks) > MAX_READINGS:
        raise too_ambiguous()
    return frozenset(stacks) if stacks else None


def check_settling_work(stacks_seen: int) -> None:
    """Raise GuidedDecodingError once settling a state has visited 16 x MAX_READINGS stacks: rules
    that call two alike at each level expand to 2^depth of them, refused as they grow rather
    than once built (2^20 took 79 s and 3.5 GB). The bound is on the work, not the readings:
    a start state may hold more than a state after a character (2,000 alternatives that
    each call a rule of their own)."""
    if stacks_seen > 16 * MAX_READINGS:
        raise too_ambiguous()


def too_ambiguous() -> GuidedDecodingError:
    return GuidedDecodingError(f"the grammar is too ambiguous to follow: the output would read "
                               f"in more than {MAX_READINGS} ways")


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
        self._takes_memo: dict[tuple[Hashable, str, str], bool] = {}
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

    def _takes_one_of(self, state: Any, lo: str, hi: str) -> bool:
        """Whether some character from lo to hi (all beyond ASCII) takes `state` somewhere.
        False where a grammar cannot tell cheaply: the guide then leaves out the byte tokens
        that begin such a character, so it never starts one it cannot end. Here: plain text
        takes any, and free text any it does not move on."""
        room = self.plain_text_room(state)
        if room is not None:
            return room >= 1
        moving = self.moving_chars(state)
        if moving is None:
            return False
        inside = [ch for ch in moving if lo <= ch <= hi]
        return len(inside) <= ord(hi) - ord(lo) or any(self.step(state, ch) is not None for ch in inside)

    def step(self, state: Any, ch: str) -> Any:
        """The state after `ch` (None: no allowed output begins so); raises GuidedDecodingError
        past MAX_READINGS, an answer remembered like the others (the token filter asks again
        for every token that begins alike)."""
        answer = _remembered(self._memo, self.memo_size, (state, ch), self._bounded_next)
        if answer is _TOO_AMBIGUOUS:
            raise too_ambiguous()
        return answer

    def _bounded_next(self, state: Any, ch: str) -> Any:
        try:
            return self._next(state, ch)
        except GuidedDecodingError:
            return _TOO_AMBIGUOUS

    def takes_one_of(self, state: Any, lo: str, hi: str) -> bool:
        return _remembered(self._takes_memo, self.memo_size, (state, lo, hi), self._takes_one_of)

    def advance_bytes(self, state: Any, pending: bytes, raw: bytes) -> tuple[Any, bytes] | None:
        """(the state, the bytes of a character begun and not ended) after a byte token's
        `raw` bytes, read after `pending`; None when no allowed output begins so."""
        split = split_utf8(pending + raw)
        state = None if split is None else self.advance_split(state, *split)
        return None if state is None else (state, split[1])

    def advance_split(self, state: Any, text: str, tail: bytes) -> Any:
        """The state after `text`, where `tail` begins a character the grammar takes next; None
        when no allowed output begins so."""
        state = self.advance(state, text)
        if state is None or (tail and not self.takes_one_of(state, *completions(tail))):
            return None
        return state

    def advance(self, state: Any, text: str) -> Any:
        """The state after `text`, or None as soon as no allowed output begins so."""
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state


def _remembered(memo: dict, memo_size: int, key: tuple, compute: Callable[..., Any]) -> Any:
    """compute(*key), kept in `memo` (emptied when it holds memo_size answers)."""
    if key in memo:
        return memo[key]
    answer = compute(*key)
    if len(memo) >= memo_size:
        memo.clear()  # another request's states, or a long one's: start over
    memo[key] = answer
    return answer
