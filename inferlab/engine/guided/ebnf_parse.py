"""EBNF grammars in llama.cpp's GBNF notation (what vLLM's guided_grammar takes) compiled into
rules of plain alternatives, for the recognizer in ebnf_grammar.py.

    root   ::= answer ("," answer)*      # a rule: name ::= alternatives
    answer ::= "yes" | "no" | [0-9]+ | .  # "literal", [class], [^negated], . any character

Sequences, `|`, `( )` groups, and the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`; names of
letters, digits, `-` and `_`; `#` comments; escapes \\n \\r \\t \\\\ \\" \\[ \\] \\- \\^ \\xHH
\\uHHHH \\UHHHHHHHH. A rule runs until the next `name ::=`, so it may span lines. The output
is a `root`. Groups and repetitions become rules of their own; a repetition is right-recursive
(R ::= X R | empty), so the recognizer's stacks do not grow with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferlab.errors import InferlabError

Ranges = tuple[tuple[str, str], ...]
Element = tuple[str, int]  # ("char", matcher index) or ("rule", rule index)

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^",
            "/": "/"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
MAX_ELEMENTS = 100_000  # what {m,n} may unroll to, all rules together
_REPETITION = re.compile(r"\s*([0-9]+)\s*(,\s*([0-9]*)\s*)?}")  # ASCII digits, as llama.cpp reads


def _count(digits: str) -> int:
    """A repetition's count; past 9 digits only its being over MAX_ELEMENTS matters (int() of
    over 4300 digits is a ValueError)."""
    return int(digits) if len(digits) <= 9 else MAX_ELEMENTS + 1


class GrammarError(InferlabError):
    """A grammar this parser cannot read, or one the recognizer cannot hold an output to."""


@dataclass(frozen=True)
class Matcher:
    ranges: Ranges  # inclusive character ranges
    negated: bool = False

    def matches(self, ch: str) -> bool:
        return any(lo <= ch <= hi for lo, hi in self.ranges) != self.negated

    def meets(self, lo: str, hi: str) -> bool:
        """Whether some character from lo to hi matches."""
        if not self.negated:
            return any(a <= hi and lo <= b for a, b in self.ranges)
        first_free = ord(lo)  # the first character of the span not yet found in a range
        for a, b in sorted(self.ranges):
            if ord(a) > first_free:
                break
            first_free = max(first_free, ord(b) + 1)
        return first_free <= ord(hi)


@dataclass
class Compiled:
    names: list[str]  # a rule's name; a group's or repetition's is its rule's, then "/n"
    alternatives: list[list[tuple[Element, ...]]]  # rule index -> its alternatives
    matchers: list[Matcher]
    root: int


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0
        self.names: list[str] = []
        self.alternatives: list[list[tuple[Element, ...]] | None] = []
        self.by_name: dict[str, int] = {}
        self.defined: set[str] = set()
        self.matchers: dict[Matcher, int] = {}
        self.elements = 0
        self.rule = ""  # the rule being read, for generated rules' names and messages

    def fail(self, message: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return GrammarError(f"grammar line {line} column {column}: {message}")

    def skip(self) -> None:
        """Past whitespace (newlines included) and comments."""
        while self.pos < len(self.text):
            if self.text[self.pos].isspace():
                self.pos += 1
            elif self.text[self.pos] == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def at_rule_start(self) -> bool:
        match = _NAME.match(self.text, self.pos)
        return match is not None and self.text.startswith("::=", _after_space(self.text, match.end()))

    def rule_index(self, name: str) -> int:
        if name not in self.by_name:
            self.by_name[name] = self.new_rule(name)
        return self.by_name[name]

    def new_rule(self, name: str) -> int:
        self.count(1)
        self.names.append(name)
        self.alternatives.append(None)
        return len(self.names) - 1

    def generated(self, alternatives: list[tuple[Element, ...]]) -> Element:
        index = self.new_rule(f"{self.rule}/{len(self.names)}")
        self.alternatives[index] = alternatives
        return ("rule", index)

    def matcher(self, matcher: Matcher) -> Element:
        return ("char", self.matchers.setdefault(matcher, len(self.matchers)))

    def grammar(self) -> Compiled:
        self.skip()
        if self.pos == len(self.text):
            raise self.fail("the grammar is empty")
        while self.pos < len(self.text):
            match = _NAME.match(self.text, self.pos)
            if match is None or not self.at_rule_start():
                raise self.fail("expected a rule: name ::= ...")
            self.rule = match.group()
            if self.rule in self.defined:
                raise self.fail(f"rule {self.rule!r} is defined twice")
            self.defined.add(self.rule)
            index = self.rule_index(self.rule)
            self.pos = _after_space(self.text, match.end()) + 3
            self.alternatives[index] = self.alternates(nested=False)
        missing = sorted(set(self.by_name) - self.defined)
        if missing:
            raise GrammarError(f"grammar: rule {missing[0]!r} is used but never defined")
        if "root" not in self.by_name:
            raise GrammarError("grammar: no root rule (the output is a root: root ::= ...)")
        return Compiled(self.names, self.alternatives, list(self.matchers), self.by_name["root"])

    def alternates(self, nested: bool) -> list[tuple[Element, ...]]:
        options = [self.sequence(nested)]
        while self.text.startswith("|", self.pos):
            self.pos += 1
            options.append(self.sequence(nested))
        return options

    def sequence(self, nested: bool) -> tuple[Element, ...]:
        items: list[Element] = []
        while True:
            self.skip()
            if self.pos == len(self.text) or self.text[self.pos] in "|)" or (
                    not nested and self.at_rule_start()):
                return tuple(items)
            elements = self.repeated(self.atom())
            self.count(len(elements))
            items.extend(elements)

    def count(self, elements: int) -> None:
        self.check_room(elements)
        self.elements += elements

    def check_room(self, elements: int) -> None:
        if self.elements + elements > MAX_ELEMENTS:
            raise self.fail(f"the grammar unrolls to over {MAX_ELEMENTS} elements")

    def atom(self) -> list[Element]:
        ch = self.text[self.pos]
        if ch == '"':
            return [self.matcher(Matcher(((c, c),))) for c in self.literal()]
        if ch == "[":
            return [self.matcher(self.char_class())]
        if ch == ".":
            self.pos += 1
            return [self.matcher(Matcher((), negated=True))]
        if ch == "(":
            self.pos += 1
            group = self.alternates(nested=True)
            self.skip()
            if not self.text.startswith(")", self.pos):
                raise self.fail("expected ')'")
            self.pos += 1
            return list(group[0]) if len(group) == 1 else [self.generated(group)]
        match = _NAME.match(self.text, self.pos)
        if match is None:
            raise self.fail(f"unexpected {ch!r}")
        self.pos = match.end()
        return [("rule", self.rule_index(match.group()))]

    def repeated(self, atom: list[Element]) -> list[Element]:
        """`atom` with the repetitions that follow it applied, as elements of the sequence; spaces
        may come before each (`("a" | "b") +`, as llama.cpp reads it)."""
        while (after := _after_space(self.text, self.pos)) < len(self.text) and self.text[after] in "*+?{":
            self.pos = after
            low, high = self.repetition()
            if not atom:  # "" or (): any number of nothings is nothing
                continue
            if len(atom) > 1:  # its elements go into a rule of their own: they count now, not
                self.count(len(atom))  # once the sequence takes the atom (x{m}{m}... grew GBs)
            one = atom[0] if len(atom) == 1 else self.generated([tuple(atom)])
            self.check_room(low)  # before [one] * low is built; the sequence counts it
            if high is None:
                star = self.new_rule(f"{self.rule}/{len(self.names)}")
                self.alternatives[star] = [(one, ("rule", star)), ()]
                atom = [one] * low + [("rule", star)]
            else:
                tail: list[Element] = []
                for _ in range(high - low):  # optional ones, each inside the one before
                    tail = [self.generated([(one, *tail), ()])]
                atom = [one] * low + tail
        return atom

    def repetition(self) -> tuple[int, int | None]:
        ch = self.text[self.pos]
        self.pos += 1
        if ch != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        match = _REPETITION.match(self.text, self.pos)
        if match is None:
            raise self.fail("expected {m}, {m,} or {m,n}")
        self.pos = match.end()
        low = _count(match.group(1))
        high = low if match.group(2) is None else _count(match.group(3)) if match.group(3) else None
        if high is not None and high < low:
            raise self.fail(f"repetition {{{low},{high}}}: the most is below the least")
        if max(low, high or 0) > MAX_ELEMENTS:  # before [one] * low is built: it would take GBs
            spec = re.sub(r"\s", "", match.group())
            raise self.fail(f"repetition {{{spec}: the grammar unrolls to over {MAX_ELEMENTS} elements")
        return low, high

    def literal(self) -> str:
        self.pos += 1
        chars = []
        while not self.text.startswith('"', self.pos):
            chars.append(self.char("a string"))
        self.pos += 1
        return "".join(chars)

    def char_class(self) -> Matcher:
        self.pos += 1
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        ranges = []
        while not self.text.startswith("]", self.pos):
            lo = hi = self.char("a character class")
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                hi = self.char("a character class")
                if hi < lo:
                    raise self.fail(f"range {lo!r}-{hi!r} runs backwards")
            ranges.append((lo, hi))
        self.pos += 1
        return Matcher(tuple(ranges), negated)

    def char(self, where: str) -> str:
        if self.pos >= len(self.text):
            raise self.fail(f"{where} is not closed")
        ch = self.text[self.pos]
        self.pos += 1
        if ch != "\\":
            return ch
        code = self.text[self.pos:self.pos + 1]
        self.pos += 1
        if code in _ESCAPES:
            return _ESCAPES[code]
        width = _HEX_DIGITS.get(code)
        digits = self.text[self.pos:self.pos + (width or 0)]
        if width is None or len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise self.fail(f"unknown escape \\{code}")
        self.pos += width
        if int(digits, 16) > 0x10FFFF:
            raise self.fail(f"escape \\{code}{digits} is past the last character")
        return chr(int(digits, 16))


def _after_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def parse_grammar(text: str) -> Compiled:
    """The grammar's rules; raises GrammarError naming the line and column of what is wrong."""
    if not isinstance(text, str):
        raise GrammarError(f"a grammar must be a string, got {type(text).__name__}")
    return _Parser(text).grammar()
