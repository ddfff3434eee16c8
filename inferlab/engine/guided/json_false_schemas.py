"""JSON subschemas that take no value: `false`, or ones built of false alone (an anyOf of
false branches, a $ref to false), which the compiler leaves out as jsonschema reads them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from inferlab.engine.guided.json_keywords import ANNOTATIONS
from inferlab.errors import InferlabError


def refs_taking_nothing(root: Any, resolve: Callable[[str], Any]) -> dict[str, bool]:
    """Each $ref of the schema `root` -> whether its target (`resolve(pointer)`) takes nothing,
    found together: every answer starts as "takes something", and a $ref is read again only when
    one it reads turns (a worklist), so the work grows with the schema, not with its paths or
    the order its properties name them. A cycle of references and nothing else takes something
    here, as does a $ref `resolve` refuses: the compiler refuses both by name."""
    targets = {}
    for pointer in dict.fromkeys(_ref_values(root)):
        with contextlib.suppress(InferlabError):
            targets[pointer] = resolve(pointer)
    readers: dict[str, list[str]] = {}  # a $ref -> the $refs whose targets read it
    for pointer, target in targets.items():
        for read in _refs_read(target):
            readers.setdefault(read, []).append(pointer)
    answers = dict.fromkeys(targets, False)
    pending = list(targets)
    while pending:
        pointer = pending.pop()
        if not answers[pointer] and takes_nothing(targets[pointer], answers):
            answers[pointer] = True
            pending.extend(readers.get(pointer, ()))
    return answers


def takes_nothing(schema: Any, refs: dict[str, bool]) -> bool:
    """Whether a schema takes no value at all: false, or built of false alone (an anyOf or
    oneOf whose every branch takes nothing, an allOf with one such, a $ref to one), each $ref's
    answer read from `refs` (a $ref not there takes something)."""
    if schema is False or not isinstance(schema, dict):
        return schema is False
    words = set(schema) - ANNOTATIONS
    value = schema.get(next(iter(words))) if len(words) == 1 else None
    if words == {"$ref"}:
        return isinstance(value, str) and refs.get(value, False)
    if not isinstance(value, list) or not value:
        return False
    if words & {"anyOf", "oneOf"}:
        return all(takes_nothing(option, refs) for option in value)
    return words == {"allOf"} and any(takes_nothing(option, refs) for option in value)


def _refs_read(schema: Any) -> Iterator[str]:
    """The $refs whose answers takes_nothing reads for this schema."""
    if not isinstance(schema, dict):
        return
    words = set(schema) - ANNOTATIONS
    value = schema.get(next(iter(words))) if len(words) == 1 else None
    if words == {"$ref"} and isinstance(value, str):
        yield value
    elif isinstance(value, list) and words & {"anyOf", "oneOf", "allOf"}:
        for option in value:
            yield from _refs_read(option)


def _ref_values(node: Any) -> Iterator[str]:
    """Every string a "$ref" key holds anywhere in the schema (an enum's data among them: their
    answers are found and never read)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _ref_values(value)
    elif isinstance(node, list):
        for item in node:
            yield from _ref_values(item)
