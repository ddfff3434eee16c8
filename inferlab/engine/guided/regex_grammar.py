"""A regular expression recognizer one character at a time, for guided decoding (vLLM's
guided_regex and structured_outputs regex): the whole output must match the pattern.

The pattern's structure (alternation, groups, quantifiers) is parsed here into a Thompson NFA;
each single-character atom (a literal, an escape such as \\d or \\w, '.', a [class]) is matched
by Python's own `re`, taking a character only where both its ASCII and its Unicode readings
take it: \\d, \\w and \\s are [0-9], [a-zA-Z0-9_] and [ \\t\\n\\r\\f\\v] (JSON Schema's patterns,
ECMA-262, read \\d and \\w so, and a Unicode \\s* let the embedded model pad a reply with U+205F
spaces once guides took byte tokens), while \\D, \\W, \\S and [^\\s] take no character Python's
Unicode \\d, \\w, \\s takes (\\S no U+001F, which the ASCII reading alone took), so Python's own
reading (jsonschema's) takes every text this one does. A state is the set of NFA positions the
text so far can reach; it is hashable, so it keys the token filter's cache. Python's `re` flags,
anchors inside the pattern, backreferences and lookaround have no place in a one-pass match of
the whole output: they are refused by name.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

from inferlab.engine.guided.grammar import Grammar
from inferlab.engine.utf8_tokens import chars_between
from inferlab.errors import InferlabError

MAX_NFA_NODES = 20_000  # (a{1000}){1000} would otherwise build a million positions
# {m}, {m,}, {m,n}, {,n}, {,} (as *); "{}" is no quantifier: Python reads it as text
_BOUNDS = re.compile(r"\{(?!\})(\d*)(,?)(\d*)\}")
_OCTAL = re.compile(r"\\[0-7]{3}")  # \177: three octal digits are a character, as Python reads them
_GROUP_REF = re.compile(r"\\[0-9]{1,2}")  # \1, \12: Python reads fewer as a group's number


class RegexError(InferlabError):
    """A pattern the recognizer does not take; the message says what in it."""


@dataclass
class _Node:
    """A position: reads one character (that `atom` matches), or branches without reading
    (`outs` only), or is the match (neither)."""

    atom: re.Pattern[str] | None = None
    outs: tuple[int, ...] = ()


# the AST: ("atom", text) | ("seq", items) | ("alt", options) | ("repeat", item, low, high|None)
_Ast = tuple


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0

    def fail(self, what: str) -> RegexError:
        return RegexError(f"regex {self.text!r} at {self.at}: {what}")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def parse(self) -> _Ast:
        if self.text.startswith("^"):
            self.at = 1  # the whole output is matched: a leading ^ or trailing $ says so again
        ast = self.alternation()
        if self.peek() == ")":
            raise self.fail("unbalanced ')'")
        return ast

    def alternation(self) -> _Ast:
        options = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self) -> _Ast:
        items = []
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "$" and self.at == len(self.text) - 1:
                self.at += 1
                break
            items.append(self.quantified(self.atom()))
        return ("seq", items)

    def quantified(self, item: _Ast) -> _Ast:
        """`item` with the quantifier that follows it, if one does (one only, as in Python)."""
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.at += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        elif ch == "{" and (bounds := _BOUNDS.match(self.text, self.at)):
            self.at = bounds.end()
            low = int(bounds[1] or 0)
            high = None if bounds[2] and not bounds[3] else int(bounds[3] or bounds[1] or 0)
            if high is not None and low > high:
                raise self.fail(f"bad repetition {bounds[0]}")
        else:
            return item
        if self.peek() == "?":
            self.at += 1  # lazy: the same strings match
        if self.peek() == "+":
            raise self.fail("possessive quantifiers are not supported")
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and _BOUNDS.match(self.text, self.at)):
            raise self.fail("multiple repeat")
        return ("repeat", item, low, high)

    def atom(self) -> _Ast:
        start, ch = self.at, self.peek()
        if ch == "(":
            return self.group()
        if ch in ("*", "+", "?") or (ch == "{" and _BOUNDS.match(self.text, start)):
            raise self.fail("nothing to repeat")
        if ch in ("^", "$"):
            raise self.fail("anchors are taken only at the pattern's start and end")
        if ch == "[":
            self.at = self.class_end()
        elif ch == "\\":
            self.at += 2
            escaped = self.text[self.at - 1:self.at]
            if not escaped:
                raise self.fail("a trailing backslash")
            if escaped in "bBAZz":
                raise self.fail(f"\\{escaped} (an anchor) is not supported")
            if escaped in "123456789" and not _OCTAL.match(self.text, start):
                raise self.fail(f"{_GROUP_REF.match(self.text, start)[0]} (a backreference) is not supported")
            if escaped in "xuUN0123456789":  # \x41, \u00e9, \U0001F600, \N{...}, \0, \177
                self.at = start + _escape_length(self.text[start:])
        else:
            self.at += 1
        return ("atom", self.text[start:self.at])

    def group(self) -> _Ast:
        self.at += 1
        if self.text.startswith("?:", self.at):
            self.at += 2
        elif (named := re.match(r"\?P<\w+>", self.text[self.at:])) is not None:
            self.at += named.end()
        elif self.peek() == "?":
            raise self.fail("lookaround, flags and other (?...) groups are not supported")
        inner = self.alternation()
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.at += 1
        return inner

    def class_end(self) -> int:
        """The index after the [class] that starts here."""
        at = self.at + 1
        if self.text.startswith("^", at):
            at += 1
        if self.text.startswith("]", at):
            at += 1
        while at < len(self.text) and self.text[at] != "]":
            at += 2 if self.text[at] == "\\" else 1
        if at >= len(self.text):
            raise self.fail("missing ']'")
        return at + 1


def top_level_alternatives(pattern: str) -> list[str]:
    """The pattern's alternatives outside any group and [class]: "^a|b$" is "^a" and "b$", each
    with its own anchors as re.search reads them."""
    parser, depth, cuts = _Parser(pattern), 0, [-1]
    while parser.at < len(pattern):
        ch = parser.peek()
        if ch == "[":
            parser.at = parser.class_end()
            continue
        if ch == "|" and depth == 0:
            cuts.append(parser.at)
        depth += {"(": 1, ")": -1}.get(ch, 0)
        parser.at += 2 if ch == "\\" else 1
    cuts.append(len(pattern))
    return [pattern[begin + 1:end] for begin, end in itertools.pairwise(cuts)]


def _escape_length(text: str) -> int:
    """Length of the escape at the start of `text` as Python's re reads it (\\x41, \\u00e9...)."""
    match = re.match(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|0[0-7]{0,2}|[0-7]{3})",
                     text)
    if match is None:
        raise RegexError(f"regex escape {text[:4]!r} is incomplete")
    return match.end()


@functools.lru_cache(maxsize=4096)
def _atom_pattern(atom: str) -> re.Pattern[str]:
    """The atom as Python's re reads it both with ASCII classes and with Unicode ones, taking a
    character only where both readings do ('.': any character but a newline)."""
    try:
        return re.compile(f"(?=(?a:{atom})){atom}")
    except re.error as e:
        raise RegexError(f"regex atom {atom!r}: {e.msg}") from None  # e's position is in the wrapping


@functools.lru_cache(maxsize=1 << 14)
def _atom_meets(atom: re.Pattern[str], lo: str, hi: str) -> bool:
    """Whether the atom matches some character from lo to hi: one search of them all, kept, as
    a pattern's few atoms recur in its many states."""
    return atom.search(chars_between(lo, hi)) is not None


# where an atom is first looked for: ASCII, then each Unicode plane
_SPANS = (("\0", "\x7f"), *((chr(plane << 16), chr((plane << 16) | 0xFFFF)) for plane in range(17)))


def _reads_a_character(atom: re.Pattern[str]) -> bool:
    """Whether some character matches the atom ([^\\s\\S] matches none)."""
    return any(_atom_meets(atom, lo, hi) for lo, hi in _SPANS)


class _Builder:
    """The AST as NFA positions, built backwards: each piece is given the position after it."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = [_Node()]  # position 0 is the match

    def add(self, node: _Node) -> int:
        if len(self.nodes) >= MAX_NFA_NODES:
            raise RegexError(f"regex too large: over {MAX_NFA_NODES} positions once repetitions "
                             "are counted out")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def build(self, ast: _Ast, after: int) -> int:
        kind = ast[0]
        if kind == "atom":  # one that matches no character is a dead end
            atom = _atom_pattern(ast[1])
            return self.add(_Node(atom=atom, outs=(after,)) if _reads_a_character(atom) else _Node())
        if kind == "seq":
            for item in reversed(ast[1]):
                after = self.build(item, after)
            return after
        if kind == "alt":
            return self.add(_Node(outs=tuple(self.build(option, after) for option in ast[1])))
        _, item, low, high = ast
        if high is None:  # a loop: the branch before the item, which comes back to it
            loop = self.add(_Node())
            self.nodes[loop].outs = (self.build(item, loop), after)
            rest = loop
        else:
            rest = after
            for _ in range(high - low):  # each optional copy may be the last
                rest = self.add(_Node(outs=(self.build(item, rest), after)))
        for _ in range(low):
            rest = self.build(item, rest)
        return rest


State = frozenset[int]


class RegexGrammar(Grammar):
    """The pattern's recognizer: a text is complete when the pattern matches it whole."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        if not isinstance(pattern, str) or not pattern:
            raise RegexError("the regex must be a non-empty string")
        builder = _Builder()
        start = builder.build(_Parser(pattern).parse(), 0)
        self.nodes = builder.nodes
        self.start: State = self._closure({start})
        self._any_char: dict[State, State] = {}
        self._finishes: dict[tuple[State, int, int | None], bool] = {}
        if not self.can_finish(self.start, 0, None):  # the guide could only force an end
            raise RegexError(f"regex {pattern!r}: it matches no text")

    def _closure(self, positions: set[int]) -> State:
        """The positions that read a character (or match), reached without reading one."""
        todo, seen, reading = list(positions), set(positions), set()
        while todo:
            index = todo.pop()
            node = self.nodes[index]
            if node.atom is not None or index == 0:
                reading.add(index)
                continue
            for out in node.outs:
                if out not in seen:
                    seen.add(out)
                    todo.append(out)
        return frozenset(reading)

    def _next(self, state: State, ch: str) -> State | None:
        moved = {self.nodes[i].outs[0] for i in state if i != 0 and self.nodes[i].atom.fullmatch(ch)}
        return self._closure(moved) or None  # nothing reached, or only dead ends

    def is_complete(self, state: State | None) -> bool:
        return state is not None and 0 in state

    def char_key(self, state: State) -> Callable[[str], tuple[bool, ...]]:
        """Which of the atoms the state's positions read take a character: the next state
        depends on nothing else."""
        atoms = list({self.nodes[i].atom for i in state if i != 0})
        return lambda ch: tuple(atom.fullmatch(ch) is not None for atom in atoms)

    def _takes_one_of(self, state: State, lo: str, hi: str) -> bool:
        return any(_atom_meets(self.nodes[i].atom, lo, hi) for i in state if i != 0)

    def can_finish(self, state: State, low: int, high: int | None) -> bool:
        """Whether some text of low to high characters (high None: no limit) takes `state` to
        a match: a JSON string's pattern beside its length bounds. Which characters they are
        is free, as every atom reads at least one, so a step moves every reading position."""
        key = (state, low, high)
        if key not in self._finishes:
            self._finishes[key] = self._finishes_within(state, low, high)
        return self._finishes[key]

    def _finishes_within(self, layer: State, low: int, high: int | None) -> bool:
        seen: set[State] = set()  # layers from step `low` on: one seen again never matches
        steps = 0
        while layer and (high is None or steps <= high):
            if steps >= low:
                if 0 in layer:
                    return True
                if layer in seen:
                    return False
                seen.add(layer)
            if layer not in self._any_char:
                self._any_char[layer] = self._closure({self.nodes[i].outs[0] for i in layer if i != 0})
            layer, steps = self._any_char[layer], steps + 1
        return False
