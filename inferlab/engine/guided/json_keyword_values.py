"""A JSON schema's keyword values read and checked for json_schema.py's compiler: item and length
counts, number bounds, string patterns and formats, types; and JSON values compared and written
as const and enum take them."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from typing import Any

from inferlab.engine.guided.json_formats import FORMATS
from inferlab.engine.guided.json_keywords import BOUND_WORDS, TYPES
from inferlab.engine.guided.json_numbers import Bound, NumberBounds
from inferlab.engine.guided.regex_grammar import RegexError, RegexGrammar, top_level_alternatives
from inferlab.engine.utf8_tokens import SURROGATES
from inferlab.errors import InferlabError


class SchemaError(InferlabError):
    """A schema the grammar cannot hold an output to; the message names the keyword."""


def count_bounds(schema: dict, low_word: str, high_word: str) -> tuple[int, int | None]:
    """(minItems, maxItems) or (minLength, maxLength), checked."""
    low, high = schema.get(low_word, 0), schema.get(high_word)
    for name, bound in ((low_word, low), (high_word, high)):
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
            raise SchemaError(f"{name} must be a non-negative integer, got {bound!r}")
    if high is not None and low > high:
        raise SchemaError(f"{low_word} ({low}) is above {high_word} ({high})")
    return low, high


MAX_BOUND_DIGITS = 1000


def number_bounds(schema: dict, integer: bool) -> NumberBounds | None:
    """The tighter of minimum and exclusiveMinimum, of maximum and exclusiveMaximum."""
    found: dict[str, Bound] = {}
    for word in BOUND_WORDS:
        if word not in schema:
            continue
        value = schema[word]
        if not isinstance(value, int | float) or isinstance(value, bool) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise SchemaError(f"{word} must be a finite number, got {value!r}")
        if isinstance(value, int) and abs(value) >= 10 ** MAX_BOUND_DIGITS:  # Python's str() of
            # an int stops at 4,300 digits; a double's range ends at 309
            raise SchemaError(f"{word} must be a number of at most {MAX_BOUND_DIGITS} digits")
        side = "high" if "max" in word.lower() else "low"
        bound = Bound(Fraction(str(value)), word.startswith("exclusive"))
        held = found.get(side)
        tighter = held is None or (bound.value > held.value if side == "low" else bound.value < held.value)
        if tighter or (bound.value == held.value and bound.strict):
            found[side] = bound
    if not found:
        return None
    bounds = NumberBounds(found.get("low"), found.get("high"), integer)
    if not bounds.reachable(""):
        raise SchemaError(f"no {'integer' if integer else 'number'} the grammar writes lies within "
                          f"{', '.join(f'{w} {schema[w]}' for w in BOUND_WORDS if w in schema)}")
    return bounds


def string_pattern(schema: dict, low: int, high: int | None) -> str | None:
    """The regex a string's decoded value must match whole (from `pattern` or `format`),
    checked to match some text of low to high characters: else the grammar would open the
    string and find no way to close it."""
    if "pattern" in schema and "format" in schema:
        raise SchemaError("pattern and format cannot be combined in one schema")
    if "format" in schema and (not isinstance(schema["format"], str) or schema["format"] not in FORMATS):
        raise SchemaError(f"format {schema['format']!r} is not supported ({', '.join(FORMATS)} are)")
    if "format" not in schema and "pattern" not in schema:
        return None
    if "pattern" in schema and (not isinstance(schema["pattern"], str) or not schema["pattern"]):
        raise SchemaError("pattern must be a non-empty string")
    source = f"format {schema['format']!r}" if "format" in schema else f"pattern {schema['pattern']!r}"
    try:
        regex = FORMATS[schema["format"]] if "format" in schema else _search_regex(schema["pattern"])
        grammar = RegexGrammar(regex)
    except RegexError as e:
        raise SchemaError(f"{source}: {str(e).split(': ', 1)[-1]}") from None
    if not grammar.can_finish(grammar.start, low, high):
        lengths = ", ".join(f"{w} {schema[w]}" for w in ("minLength", "maxLength") if w in schema)
        raise SchemaError(f"no string that {source} matches has a length within {lengths}")
    return regex


def _search_regex(pattern: str) -> str:
    """JSON Schema's pattern is a search (Python's re.search, as jsonschema runs it): the regex of
    the whole texts it is found in, each top-level alternative anchored on its own (^a|b is ^a or
    b, not ^(a|b))."""
    return "|".join(map(_searched, top_level_alternatives(pattern)))


def _searched(alternative: str) -> str:
    """One alternative as the regex of the whole texts re.search finds it in: an end without its
    anchor takes any text, and Python's $ also matches before a last newline."""
    starts = alternative.startswith("^")
    core = alternative[int(starts):]
    escapes = len(core[:-1]) - len(core[:-1].rstrip("\\"))  # an odd count before $ makes \$ a dollar
    ends = core.endswith("$") and escapes % 2 == 0
    core = core[:len(core) - int(ends)]
    anything = r"[\s\S]*"
    return f"{'' if starts else anything}(?:{core}){chr(92) + 'n?' if ends else anything}"


def schema_types(value: Any) -> list[str]:
    types = [value] if isinstance(value, str) else value
    if not isinstance(types, list) or not types or any(t not in TYPES for t in types):
        raise SchemaError(f"type must be one of {', '.join(TYPES)} or a list of them, got {value!r}")
    return types


def is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    return isinstance(value, expected[kind])


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values, as JSON Schema's const and enum compare them: 1 is 1.0, true is not 1,
    arrays item by item, objects key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(json_equal, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    return a == b


_SPLIT_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def json_text(value: Any) -> str:
    """`value` as one compact JSON text. A lone surrogate (JSON's "\\ud800") is written as its
    \\u escape, the only spelling a model's tokens have for it; json.loads reads it back."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise SchemaError(f"{value!r} is not a JSON value") from None
    if _SPLIT_PAIR.search(text):  # json.loads would join the two escapes into one character
        raise SchemaError(f"{value!r} holds a surrogate pair as two code points, which no JSON "
                          "text reads back as")
    return SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
