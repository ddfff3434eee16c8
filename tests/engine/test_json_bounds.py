"""Numbers held to bounds, against jsonschema over every short number text (strings held to
lengths are test_json_schema's), and strings whose pattern and length bounds meet.

For each bounded number schema: every number text of a grid of values is complete exactly when
jsonschema validates it (json_reference.reference_accepts, with the grammar's spelling rule),
and every prefix the grammar keeps alive still has an end it calls complete (no dead ends).
"""

from __future__ import annotations

import json

import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar

from .grammar_fuzz import complete, read_whole
from .json_reference import reference_accepts

NUMBER_SCHEMAS = [
    {"type": "integer", "minimum": 18, "maximum": 120},
    {"type": "integer", "exclusiveMinimum": -30, "maximum": -7},
    {"type": "integer", "minimum": 7, "maximum": 7},
    {"type": "integer", "maximum": -100},
    {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 0.1},
    {"type": "number", "minimum": 0.5},
    {"type": "number", "maximum": -0.25},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.002},
    {"type": "number", "minimum": 99.5, "maximum": 100, "exclusiveMaximum": 100.5},
    {"type": "number", "minimum": 1e14, "maximum": 2e14},  # 15 digits before the point
    {"type": "number", "maximum": 1e20},  # integers of 21 digits: exact, as under type integer
    {"type": "number", "exclusiveMaximum": 1e20},
]
FRACTIONS = ("", ".", ".0", ".05", ".1", ".25", ".5", ".001", ".0015", ".999", "e1", "E-2")


def _number_texts() -> list[str]:
    texts = ["", "-", "00", "01", "-01", "--1", "1-", "1..5", "0.0019999", "0.00199999999999999",
             # at the 15-digit limit of a non-integer's digits, and past it
             "123456789012345", "123456789012345.", "1234567890123456", "12345678901234.5",
             "12345678901234.56", "0.000000000000015", "0.0000000000000151", "-0.000000000000015",
             # integers past 15 digits, around 1e20
             "100000000000000000000", "99999999999999999999", "100000000000000000001", "-100000000000000000000",
             "100000000000000000000.5", "99999999999999999999.5", "1e20", "1234567890123456789012"]
    for whole in [*range(0, 131), 999]:
        texts += [sign + str(whole) + fraction for sign in ("", "-") for fraction in FRACTIONS]
    return texts


def _finishes(grammar: JsonGrammar, state, depth: int, alphabet: str = "0123456789.-") -> bool:
    """Some text of at most `depth` more characters takes `state` to a complete one (depth
    first: where every live state can end, the first live path ends)."""
    if grammar.is_complete(state):
        return True
    return depth > 0 and any(
        (nxt := grammar.step(state, ch)) is not None and _finishes(grammar, nxt, depth - 1, alphabet)
        for ch in alphabet)


@pytest.mark.parametrize("schema", NUMBER_SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_bounded_numbers_are_complete_exactly_when_jsonschema_validates(schema):
    grammar = JsonGrammar(schema)
    for text in _number_texts():
        assert complete(grammar, text) == reference_accepts(schema, text), text


@pytest.mark.parametrize("schema", NUMBER_SCHEMAS, ids=lambda s: json.dumps(s)[:60])
def test_every_prefix_a_bounded_number_keeps_alive_can_still_end(schema):
    grammar = JsonGrammar(schema)
    seeds = ("", "-", "12345678901", "0.0000000000", "-0.0000000000")  # the last near the digit limit
    frontier = [(seed, 0, state) for seed in seeds if (state := grammar.advance(grammar.start, seed)) is not None]
    seen = 0
    while frontier:
        text, depth, state = frontier.pop()
        assert _finishes(grammar, state, 16), f"dead end after {text!r}"
        seen += 1
        if depth < 5:  # a few digits of each kind: 0, small, middle, large
            frontier += [(text + ch, depth + 1, nxt) for ch in "01579.-"
                         if (nxt := grammar.step(state, ch)) is not None]
    assert seen >= 2  # the start and a first character at least


STRING_SCHEMAS = [  # each once let a text through after which nothing was allowed
    ({"type": "string", "pattern": "^(a|bbbb)$", "maxLength": 2}, ['"a"'], ['"b', '"\\u0062']),
    ({"type": "string", "pattern": "^[a-z]*$", "minLength": 2}, ['"ab"', '"\\u0061b"'],
     ['"\\n']),  # Python's $ takes a last line break: then no character may follow
    ({"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 5}, ['"abab"'],
     ['"ab"', '"ababa']),
]
STRING_ALPHABET = '"ab\\nu0612'  # the quote first: short ends are found first


@pytest.mark.parametrize(("schema", "whole", "refused"), STRING_SCHEMAS, ids=lambda s: json.dumps(s)[:50])
def test_a_string_whose_pattern_and_lengths_meet_never_reaches_a_dead_end(schema, whole, refused):
    grammar = JsonGrammar(schema)
    assert all(complete(grammar, text) and reference_accepts(schema, text) for text in whole)
    assert all(grammar.advance(grammar.start, text) is None for text in refused)
    frontier, seen = [("", grammar.start)], 0
    while frontier:
        text, state = frontier.pop()
        assert _finishes(grammar, state, 12, STRING_ALPHABET), f"dead end after {text!r}"
        seen += 1
        if len(text) < 6:
            frontier += [(text + ch, nxt) for ch in STRING_ALPHABET
                         if (nxt := grammar.step(state, ch)) is not None]
    assert seen >= 3


def test_a_number_bound_past_15_digits_is_met_by_integer_literals():
    """minimum 1e20 was refused: the grammar wrote no integer literal past 15 digits under type
    number, though readers keep integers exact."""
    schema = {"type": "number", "minimum": 1e20}
    grammar = JsonGrammar(schema)
    for text in _number_texts():
        assert complete(grammar, text) == reference_accepts(schema, text), text
    read_whole(grammar, "100000000000000000000")
    assert _finishes(grammar, grammar.advance(grammar.start, "10000000"), 16)  # a prefix can still end
