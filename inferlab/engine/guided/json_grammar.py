"""A JSON recognizer one character at a time, held to a compiled schema (json_schema.py), for
guided decoding (OpenAI's json_object and json_schema response formats).

The text must be one JSON value (RFC 8259) that the schema takes, with nothing before or after
it: whitespace is taken between tokens inside containers, not around the value, and a gap
between two tokens holds at most one line break and GAP_BLANKS spaces or tabs (llama.cpp's JSON
grammars bound it the same way, outlines to one space). Unbounded, a small model held to a schema
pads without end: SmolLM2-135M spent a 60-token tool call on newlines and indentation.

A state is a set of stacks, one for each way the text so far can be read (a union's branches,
a number that may end or go on); a stack holds a frame (node index, mode, data) for each value
that is open, innermost last. The text is complete when one stack is empty. States are
hashable: they key the token filter's cache (token_filter.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

from inferlab.engine.guided.grammar import Grammar, bounded_state
from inferlab.engine.guided.json_nodes import (
    ArrayNode,
    LiteralNode,
    Node,
    NumberNode,
    ObjectNode,
    StringNode,
    UnionNode,
)
from inferlab.engine.guided.json_schema import compile_schema
from inferlab.engine.guided.regex_grammar import RegexGrammar
from inferlab.engine.utf8_tokens import SURROGATE_POINTS

Frame = tuple[int, str, Any]  # (node index, mode, data)
Stack = tuple[Frame, ...]
State = frozenset[Stack]

WHITESPACE = frozenset(" \t\n\r")
GAP_BLANKS = 20  # spaces and tabs in one gap: an indent of 2 ten levels deep
Gap = tuple[bool, bool, int]  # (a line break read, a "\r" read that "\n" must follow, blanks read)
_NO_GAP: Gap = (False, False, 0)
_HEX = frozenset("0123456789abcdefABCDEF")
_UNESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_ESCAPED = frozenset(_UNESCAPED)
_CLOSED = "closed"  # a string's closing quote
_NUMBER_ENDS = frozenset({"n_zero", "n_int", "n_frac", "n_exp"})  # a number may end here
_NUMBER_STEPS = {  # mode -> {character class: next mode}
    "n_minus": {"0": "n_zero", "1": "n_int"},
    "n_zero": {".": "n_dot", "e": "n_e"},
    "n_int": {"0": "n_int", "1": "n_int", ".": "n_dot", "e": "n_e"},
    "n_dot": {"0": "n_frac", "1": "n_frac"},
    "n_frac": {"0": "n_frac", "1": "n_frac", "e": "n_e"},
    "n_e": {"+": "n_sign", "0": "n_exp", "1": "n_exp"},
    "n_sign": {"0": "n_exp", "1": "n_exp"},
    "n_exp": {"0": "n_exp", "1": "n_exp"},
}
_NUMBER_STARTS = {"-": "n_minus", "0": "n_zero"}


def _number_class(ch: str) -> str:
    if ch == "0":
        return "0"
    if "1" <= ch <= "9":
        return "1"
    return {"E": "e", "-": "+"}.get(ch, ch)


def gap_char(gap: Gap, ch: str) -> Gap | None:
    """A gap between two tokens after whitespace `ch`, or None where the gap cannot take it."""
    broke, carriage_return, blanks = gap
    if carriage_return:
        return (True, False, blanks) if ch == "\n" else None
    if ch in "\r\n":
        return None if broke else (ch == "\n", ch == "\r", blanks)
    return (broke, False, blanks + 1) if blanks < GAP_BLANKS else None


def string_char(sub: str, ch: str) -> str | None:
    """Inside a string: the sub-mode after `ch` ("" plain, "esc" after a backslash, "u1".."u4"
    in a \\u escape), _CLOSED at the closing quote, None if JSON has no such string."""
    if sub == "":
        if ch == '"':
            return _CLOSED
        if ch == "\\":
            return "esc"
        return None if ch < " " else ""  # control characters must be escaped
    if sub == "esc":
        return "u1" if ch == "u" else "" if ch in _ESCAPED else None
    if ch not in _HEX:
        return None
    return "" if sub == "u4" else f"u{int(sub[1]) + 1}"


class JsonGrammar(Grammar):
    """The schema's recognizer: a text is complete when it is one JSON value the schema takes."""

    def __init__(self, schema: Any, whitespace: bool = True) -> None:
        """whitespace False: none at all, compact JSON (vLLM's disable_any_whitespace)."""
        super().__init__()
        self.whitespace = whitespace
        self.nodes: tuple[Node, ...] = compile_schema(schema)
        self.start: State = frozenset({((0, "start", None),)})
        # node index -> the recognizer of its strings' decoded values (pattern, format)
        self.patterns = {i: RegexGrammar(node.pattern) for i, node in enumerate(self.nodes)
                         if isinstance(node, StringNode) and node.pattern is not None}

    def _next(self, state: State, ch: str) -> State | None:
        stacks = {after for stack in state for after in self._step(stack, ch)}
        return bounded_state(stacks)

    def is_complete(self, state: State | None) -> bool:
        return state is not None and () in state

    def plain_text_room(self, state: State) -> float | None:
        """Every reading is inside a string of any text (or held to a length alone), after no
        backslash: the most characters one of them takes."""
        rooms = [self._plain_room(stack) for stack in state]
        return None if None in rooms or not rooms else max(rooms)

    def _plain_room(self, stack: Stack) -> float | None:
        if not stack:
            return None
        index, mode, data = stack[-1]
        if mode in ("str", "key") and data[-1] == "":
            return math.inf
        if mode != "pstr" or data[0] != "" or index in self.patterns:
            return None
        node = self.nodes[index]
        return math.inf if node.max_length is None else node.max_length - data[3]

    def _takes_one_of(self, state: State, lo: str, hi: str) -> bool:
        return any(self._stack_takes(stack, lo, hi) for stack in state)

    def _stack_takes(self, stack: Stack, lo: str, hi: str) -> bool:
        """The top of the stack is inside a string that takes any plain character, or inside a
        declared key or an enum or const text whose next character is in the range. (A string
        held to a pattern answers False: its regex and its length bounds would both be asked.)"""
        if not stack:
            return False
        index, mode, data = stack[-1]
        if mode in ("str", "key"):
            return data[-1] == ""  # not inside an escape
        if mode == "pstr":
            return (self._plain_room(stack) or 0) >= 1
        if mode == "lit":
            texts, read = self.nodes[index].texts, data
        elif mode == "lkey":
            node, (at, read) = self.nodes[index], data
            texts = [t for t, key in node.key_texts.items() if key in node.open_keys(at)]
        else:
            return False
        return any(lo <= t[len(read)] <= hi for t in texts if t.startswith(read) and t != read)

    def _step(self, stack: Stack, ch: str) -> list[Stack]:
        if not stack:
            return []  # the value is whole: nothing may follow it
        index, mode, data = stack[-1]
        below = stack[:-1]
        if mode == "gap":  # the container below reads the token after it
            if ch in WHITESPACE:
                return self._gap(below, data, ch)
            return [] if data[1] else self._step(below, ch)
        if mode == "start":
            return self._begin(index, ch, below)
        node = self.nodes[index]
        if isinstance(node, ObjectNode):
            return self._object(index, node, mode, data, ch, below)
        if isinstance(node, ArrayNode):
            return self._array(index, node, mode, data, ch, below)
        if isinstance(node, LiteralNode):
            return self._literal(index, node.texts, data + ch, below)
        if isinstance(node, NumberNode):
            return self._number(index, node, mode, data, ch, below)
        if mode == "pstr":
            return self._held_string(index, node, data, ch, below)
        sub = string_char(data[0], ch)  # a StringNode: data is (sub-mode,)
        if sub is None:
            return []
        return [below] if sub == _CLOSED else [(*below, (index, "str", (sub,)))]

    def _gap(self, container: Stack, gap: Gap, ch: str) -> list[Stack]:
        """Whitespace `ch` between two tokens of the container on top of `container`."""
        after = gap_char(gap, ch) if self.whitespace else None
        return [] if after is None else [(*container, (-1, "gap", after))]

    def _begin(self, index: int, ch: str, below: Stack) -> list[Stack]:
        """The stacks after `ch` starts a value of node `index` (its container already past it)."""
        node = self.nodes[index]
        if isinstance(node, UnionNode):
            return [stack for option in node.options for stack in self._begin(option, ch, below)]
        if isinstance(node, ObjectNode):
            return [(*below, (index, "first", 0))] if ch == "{" else []
        if isinstance(node, ArrayNode):
            return [(*below, (index, "first", 0))] if ch == "[" else []
        if isinstance(node, StringNode):
            if ch != '"':
                return []
            if node.constrained:
                regex = self.patterns.get(index)
                inner = None if regex is None else regex.start
                if not self._can_finish(regex, inner, node, 0, 0):
                    return []  # the pattern takes no text of a length the bounds allow
                return [(*below, (index, "pstr", ("", inner, "", 0)))]
            return [(*below, (index, "str", ("",)))]
        if isinstance(node, LiteralNode):
            return self._literal(index, node.texts, ch, below)
        if ch == "-" or "0" <= ch <= "9":
            return self._number_goes_on(index, node, _NUMBER_STARTS.get(ch, "n_int"), "", ch, below)
        return []

    def _held_string(self, index: int, node: StringNode, data: tuple, ch: str,
                     below: Stack) -> list[Stack]:
        """A string held to a regex (pattern, format) or a length: `data` is (sub-mode, the
        regex's state (None without one), the \\u escape's hex digits so far, the characters
        read, counted no higher than the bounds need); each decoded character steps the regex."""
        sub, inner, digits, count = data
        regex = self.patterns.get(index)
        room = node.max_length is None or count < node.max_length
        if sub == "":
            if ch == '"':
                whole = count >= node.min_length and (regex is None or regex.is_complete(inner))
                return [below] if whole else []
            if ch == "\\":  # an escape can write any character: one must be allowed
                more = room and self._can_finish(regex, inner, node, count, 1)
                return [(*below, (index, "pstr", ("esc", inner, "", count)))] if more else []
            decoded = None if ch < " " else ch
        elif sub == "esc":
            if ch == "u":
                return [(*below, (index, "pstr", ("u", inner, "", count)))]
            decoded = _UNESCAPED.get(ch)
        else:
            if ch not in _HEX:
                return []
            digits += ch
            if len(digits) < 4:  # go on only if some character these digits begin is allowed
                low = int(digits, 16) << 4 * (4 - len(digits))
                if any(self._takes(regex, inner, node, count, chr(c))
                       for c in range(low, low + 16 ** (4 - len(digits)))):
                    return [(*below, (index, "pstr", ("u", inner, digits, count)))]
                return []
            decoded = chr(int(digits, 16))
        if decoded is None or not room or not self._takes(regex, inner, node, count, decoded):
            return []
        cap = max(node.min_length, node.max_length or 0)
        nxt = inner if regex is None else regex.step(inner, decoded)
        return [(*below, (index, "pstr", ("", nxt, "", min(count + 1, cap))))]

    def _takes(self, regex: RegexGrammar | None, inner: Any, node: StringNode, count: int,
               ch: str) -> bool:
        """Whether `ch` may be the string's next character: the regex reads it, and after it
        the pattern and the length bounds can still both be met. Else a text such as "bb for
        ^(a|bbbb)$ with maxLength 2 would be let through, after which no character, not even
        the closing quote, is allowed."""
        if not self._reads(regex, inner, ch):
            return False
        return regex is None or self._can_finish(regex, regex.step(inner, ch), node, count + 1, 0)

    @staticmethod
    def _can_finish(regex: RegexGrammar | None, inner: Any, node: StringNode, count: int,
                    more: int) -> bool:
        """Whether the string, `count` characters in, can close after at least `more` others
        with its regex matched and its length within the bounds."""
        high = None if node.max_length is None else node.max_length - count
        if high is not None and high < more:
            return False
        return regex is None or regex.can_finish(inner, max(more, node.min_length - count), high)

    @staticmethod
    def _reads(regex: RegexGrammar | None, inner: Any, ch: str) -> bool:
        """The regex (if any) takes `ch` next; half a surrogate pair is never a character here
        (escaped, a pair would count two where a validator counts one)."""
        if ord(ch) in SURROGATE_POINTS:
            return False
        return regex is None or regex.step(inner, ch) is not None

    @staticmethod
    def _literal(index: int, texts: tuple[str, ...], text: str, below: Stack) -> list[Stack]:
        """One of `texts` so far; when `text` is whole, the value may also end here."""
        stacks = [(*below, (index, "lit", text))] if any(
            t.startswith(text) and t != text for t in texts) else []
        return stacks + [below] if text in texts else stacks

    def _number(self, index: int, node: NumberNode, mode: str, text: str | None, ch: str,
                below: Stack) -> list[Stack]:
        nxt = _NUMBER_STEPS[mode].get(_number_class(ch))
        if nxt is None:
            return []  # where the number could end, the stack without it reads `ch`
        return self._number_goes_on(index, node, nxt, text, ch, below)

    @staticmethod
    def _number_goes_on(index: int, node: NumberNode, mode: str, text: str | None, ch: str,
                        below: Stack) -> list[Stack]:
        """The stacks after `ch` took the number to `mode`: it goes on, and it may end. A bounded
        number keeps its text (`data`) and goes on only where some end of it is in bounds."""
        if (mode == "n_e" and (node.integer or node.bounds)) or (mode == "n_dot" and node.integer):
            return []  # integers have no fraction; integers and bounded numbers no exponent
        bounds = node.bounds
        if bounds is None:
            return [(*below, (index, mode, None))] + ([below] if mode in _NUMBER_ENDS else [])
        text += ch
        stacks = [(*below, (index, mode, text))] if bounds.reachable(text) else []
        return stacks + ([below] if mode in _NUMBER_ENDS and bounds.may_end(text) else [])

    def _object(self, index: int, node: ObjectNode, mode: str, data: Any, ch: str,
                below: Stack) -> list[Stack]:
        """Modes: first (after '{'), next (after ','), key / lkey (in a key), colon, value
        (after ':'), after (after a value). `data` begins with the place in the declared keys'
        order from which they may still come (ObjectNode)."""
        at = data if mode in ("first", "next", "after") else data[0]
        if mode in ("first", "next", "colon", "value", "after") and ch in WHITESPACE:
            return self._gap((*below, (index, mode, data)), _NO_GAP, ch)
        if mode in ("first", "next") and ch == '"':
            # while a required key is to come, only the declared keys up to it may: a free key
            # would grow without end, refused only at its closing quote
            if node.extra is None or not node.may_end(at):
                return self._declared_key(index, node, at, ch, below)
            return [(*below, (index, "key", (at, "" if node.properties else None, "")))]
        if mode == "lkey":
            return self._declared_key(index, node, at, data[1] + ch, below)
        if mode == "key":
            return self._free_key(index, node, data, ch, below)
        if mode == "colon":
            return [(*below, (index, "value", data))] if ch == ":" else []
        if mode == "value":
            key = data[1]
            if key in node.properties:
                after = (*below, (index, "after", node.position[key] + 1))
                return self._begin(node.properties[key], ch, after)
            return self._begin(node.extra, ch, (*below, (index, "after", len(node.properties))))
        if ch == "}" and mode != "next" and node.may_end(at):
            return [below]
        more = node.extra is not None or at < len(node.properties)
        return [(*below, (index, "next", at))] if mode == "after" and ch == "," and more else []

    @staticmethod
    def _declared_key(index: int, node: ObjectNode, at: int, text: str, below: Stack) -> list[Stack]:
        """A key that must be one of the declared ones that may come next, matched as its JSON
        text."""
        allowed = node.open_keys(at)
        open_keys = [t for t, key in node.key_texts.items() if key in allowed and t.startswith(text)]
        if text in open_keys:  # a key's text ends at its quote: no other goes on from it
            return [(*below, (index, "colon", (at, node.key_texts[text])))]
        return [(*below, (index, "lkey", (at, text)))] if open_keys else []

    @staticmethod
    def _free_key(index: int, node: ObjectNode, data: Any, ch: str, below: Stack) -> list[Stack]:
        """Any key (additionalProperties, no required key left); its text is kept only to find a
        declared key's schema. A declared key must be one that may come next."""
        at, raw, sub = data
        nxt = string_char(sub, ch)
        if nxt is None:
            return []
        if nxt == _CLOSED:
            key = json.loads(f'"{raw}"') if raw is not None else None
            fits = key not in node.properties or key in node.open_keys(at)
            return [(*below, (index, "colon", (at, key)))] if fits else []
        return [(*below, (index, "key", (at, None if raw is None else raw + ch, nxt)))]

    def _array(self, index: int, node: ArrayNode, mode: str, count: int, ch: str,
               below: Stack) -> list[Stack]:
        """Modes: first (after '['), next (after ','), after (after an item). `count` is the items
        read, held no higher than the bounds need, so long arrays share their states."""
        if ch in WHITESPACE:
            return self._gap((*below, (index, mode, count)), _NO_GAP, ch)
        if ch == "]" and mode != "next" and count >= node.min_items:
            return [below]
        if mode == "after":
            room = node.max_items is None or count < node.max_items
            return [(*below, (index, "next", count))] if ch == "," and room else []
        if mode == "first" and node.max_items == 0:
            return []
        cap = max(node.min_items, node.max_items or 0, len(node.prefix))
        item = node.prefix[count] if count < len(node.prefix) else node.items
        return self._begin(item, ch, (*below, (index, "after", min(count + 1, cap))))
