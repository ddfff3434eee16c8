"""A schema's lone surrogates (JSON's "\\ud800", which json.loads keeps as one code point) in
enum and const values and in property names: no token spells the code point itself, so the
grammar writes its \\u escape, which jsonschema reads back as the value the schema names."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import SchemaError

from .grammar_fuzz import complete, finished_walks

SCHEMAS = {
    "enum": ({"enum": ["\ud800", "ok"]}, '"\\ud800"'),
    "const": ({"const": "a\udc00b"}, '"a\\udc00b"'),
    "nested": ({"enum": [["\udfff"]]}, '["\\udfff"]'),
    "key": ({"type": "object", "properties": {"\ud800": {"type": "integer"}},
             "required": ["\ud800"]}, '{"\\ud800":1}'),
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_a_lone_surrogate_is_written_as_its_escape_and_validates(name):
    schema, text = SCHEMAS[name]
    grammar = JsonGrammar(schema)
    assert complete(grammar, text)
    jsonschema.validate(json.loads(text), schema)
    # the code point itself: no token's text holds it, and the recognizer does not take it
    assert grammar.advance(grammar.start, json.dumps(json.loads(text), ensure_ascii=False)) is None


@pytest.mark.parametrize("name", SCHEMAS)
def test_random_walks_end_in_texts_the_schema_validates(name):
    schema, _ = SCHEMAS[name]
    alphabet = list('"\\{}[],:0189abcdfku ')
    texts = finished_walks(JsonGrammar(schema), random.Random(7), 30, 40, alphabet)
    assert texts
    for text in texts:
        jsonschema.validate(json.loads(text), schema)


def test_a_pair_held_as_two_code_points_is_refused():
    """From Python, "\ud83d\ude00" can be two code points; its JSON text reads back as one
    character, so no output could equal the value."""
    with pytest.raises(SchemaError, match="surrogate pair as two code points"):
        JsonGrammar({"enum": ["\ud83d\ude00"]})
