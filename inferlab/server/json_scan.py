"""JSON objects in text as it streams in, for the tool parsers (tool_parsers.py,
tool_call_formats.py): where the objects at one nesting level open and close, and where the open
one's values lie, without parsing the text again at each delta."""

from __future__ import annotations

import json
from collections.abc import Iterator


class ObjectEnds:
    """Where JSON objects at one nesting level close, as text arrives: strings and their escapes
    are followed, so a brace inside a string does not count. For the object open at the level it
    also notes where each key's value lies, once the value is a string, object or array; a key's
    first value only, so what is noted never changes with how far the text has come."""

    def __init__(self, level: int) -> None:
        self.level = level  # 0: objects at the top; 1: objects inside one array
        self.depth = 0
        self.in_string = self.escaped = False
        self.start: int | None = None  # where the open object began
        self.array_end: int | None = None  # just past the array around the objects (level 1)
        self.fields: dict[str, list[int | None]] = {}  # key -> [value start, end (None: open)]
        self.key: str | None = None  # the open object's key whose value comes next
        self.key_start = 0  # where the key being read began
        self.noting = False  # the value being read is the first of its key's

    def scan(self, text: str, start: int) -> Iterator[tuple[int, int]]:
        """Spans [begin, end) of the objects at the level that close in text[start:]; at level
        1, none after the array around them has closed (what follows it is no call)."""
        for i in range(start, len(text)):
            if self.level and self.array_end is not None:
                return
            ch = text[i]
            inside = self.start is not None and self.depth == self.level + 1
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (
                    ch == "\\", ch != '"')
                if inside and not self.in_string:
                    self._string_closed(text, i)
            elif ch == '"':
                self.in_string = True
                if inside:
                    self._value_opens(i)
                    self.key_start = i
            elif ch in "[{":
                if self.depth == self.level and ch == "{":
                    self.start, self.fields, self.key = i, {}, None
                elif inside:
                    self._value_opens(i)
                self.depth += 1
            elif ch in "]}":
                self.depth -= 1
                if self.depth == self.level + 1:
                    self._value_closes(i + 1)
                if self.depth == self.level and self.start is not None:  # "]" too: ill-formed,
                    yield self.start, i + 1  # but the object ends there all the same
                    self.start = None
                if self.depth < self.level and self.array_end is None:
                    self.array_end = i + 1
            elif ch == "," and inside:
                self.key = None  # after a number or literal

    def _value_opens(self, at: int) -> None:
        self.noting = self.key is not None and self.key not in self.fields
        if self.noting:
            self.fields[str(self.key)] = [at, None]

    def _value_closes(self, end: int) -> None:
        if self.noting:
            self.fields[str(self.key)][1] = end
        self.key, self.noting = None, False

    def _string_closed(self, text: str, at: int) -> None:
        if self.key is None:  # a key: its value comes next (a key JSON cannot read is kept raw)
            raw = text[self.key_start:at + 1]
            key = json_string(raw)
            self.key = raw if key is None else key
        else:
            self._value_closes(at + 1)


def json_string(text: str) -> str | None:
    """The string a JSON string literal stands for; None if it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
