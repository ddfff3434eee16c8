"""The nodes a JSON schema compiles to (json_schema.py), one a (sub)schema, which the recognizer
(json_grammar.py) holds an output to. Nodes name each other by their index in the compiled tuple,
so recursive schemas compile and grammar states (tuples of indices) stay small and hashable."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from inferlab.engine.guided.json_numbers import NumberBounds


@dataclass(frozen=True)
class ObjectNode:
    """Declared keys come in the order of `properties`, as xgrammar and llguidance hold them (a
    reply then reads in the order the schema was written: a call's name before its arguments),
    each optional one may be left out, and other keys only after every required one."""

    properties: dict[str, int]  # declared key -> its value's node
    required: frozenset[str]
    extra: int | None  # the node of any other key's value; None: no other keys
    key_texts: dict[str, str]  # a declared key's JSON text, quotes included -> the key

    @cached_property
    def position(self) -> dict[str, int]:
        """A declared key's place in the order."""
        return {key: i for i, key in enumerate(self.properties)}

    @cached_property
    def _next_required(self) -> tuple[int, ...]:
        """[at]: the place of the first required key from place `at` on (len(properties): none)."""
        keys = list(self.properties)
        return tuple(next((i for i in range(at, len(keys)) if keys[i] in self.required), len(keys))
                     for at in range(len(keys) + 1))

    def open_keys(self, at: int) -> list[str]:
        """The declared keys that may come next once those before place `at` are behind: up to
        the first required one, which may not be left out."""
        return list(self.properties)[at:self._next_required[at] + 1]

    def may_end(self, at: int) -> bool:
        """Whether no required key is left from place `at` on (so the object may close, and other
        keys may come)."""
        return self._next_required[at] == len(self.properties)


@dataclass(frozen=True)
class ArrayNode:
    items: int  # the node of the items after prefix
    min_items: int
    max_items: int | None
    prefix: tuple[int, ...] = ()  # prefixItems: the first items' nodes, in order


@dataclass(frozen=True)
class StringNode:
    pattern: str | None = None  # a regex the decoded value matches whole (from pattern or format)
    min_length: int = 0
    max_length: int | None = None

    @property
    def constrained(self) -> bool:
        return self.pattern is not None or self.min_length > 0 or self.max_length is not None


@dataclass(frozen=True)
class NumberNode:
    integer: bool
    bounds: NumberBounds | None = None


@dataclass(frozen=True)
class LiteralNode:
    texts: tuple[str, ...]  # the values' compact JSON texts (enum, const, booleans, null)


@dataclass(frozen=True)
class UnionNode:
    options: tuple[int, ...]


Node = ObjectNode | ArrayNode | StringNode | NumberNode | LiteralNode | UnionNode
