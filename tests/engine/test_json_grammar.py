"""The JSON object recognizer (json_object: any object) against Python's json module, the reference parser.

A text is complete for the recognizer exactly when json.loads reads it as an object with nothing
around it (NaN and Infinity, which json.loads takes, refused) and its whitespace runs stay in
bounds (gaps_in_bounds); every prefix of such a text stays viable, so guided decoding can always
go on to a whole object.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import OBJECT_SCHEMA

from .grammar_fuzz import edit, gaps_in_bounds, whitespace_runs

GRAMMAR = JsonGrammar(OBJECT_SCHEMA)
START = GRAMMAR.start
advance, is_complete = GRAMMAR.advance, GRAMMAR.is_complete


def reference_accepts(text: str) -> bool:
    if not text or text[0] != "{" or text[-1] != "}":  # no whitespace around the object
        return False

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and gaps_in_bounds(text)


HAND_CASES = [
    "{}", '{"a":1}', '{"a": [1, 2.5e-3, -0, true, false, null, "x\\u00e9\\n\\"\\\\\\/"]}',
    '{ "a" :{ "b" : [ ] } ,"c":[[]]}', '{"a":01}', '{"a":1.}', '{"a":-}', '{"a":.5}', '{"a":1,}',
    "{,}", '{"a"}', "[1]", " {}", "{} ", '{"a":"\x01"}', '{"a":tru}', '{"a":1e5}', '{"a":1E+5}',
    '{"a":1e}', '{"\\q":1}', '{"a":NaN}', '{"a":Infinity}', '{"a":[1,]}', '{"a":[,1]}',
    '{"a":{}}}', '{"\\u12g4":1}', '{"a":"\\u00"}', "{'a':1}", '{"a":1 2}', '{"a":-01}',
    '{\r\n "a" :\t1 \n}', '{\n\n"a":1}', '{"a":\r1}', '{"a":\n\r\n1}', '{"a":' + " " * 20 + "1}",
    '{"a":' + " " * 21 + "1}", '{"a":[1 ,\t\t\n' + "\t" * 18 + '2]}', '{"a":"\n\n   \n"}',
]


def test_hand_cases_agree_with_json_loads():
    for text in HAND_CASES:
        assert is_complete(advance(START, text)) == reference_accepts(text), text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)
layouts = st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")},
                           {"separators": (" , ", " :\t")}, {"indent": "\t", "ensure_ascii": False}])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5), layouts)
def test_every_prefix_of_an_object_is_viable_and_the_whole_is_complete(value, layout):
    text = json.dumps(value, **layout)
    if not gaps_in_bounds(text):  # indented past 20 spaces
        assert advance(START, text) is None
        return
    state = START
    for i, ch in enumerate(text):
        state = advance(state, ch)
        assert state is not None, text[: i + 1]
        assert not is_complete(state) or i == len(text) - 1
    assert is_complete(state)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=3), json_values, max_size=3), layouts, st.randoms())
def test_edited_texts_are_complete_exactly_when_json_loads_reads_an_object(value, layout, rng):
    text = edit(json.dumps(value, **layout), rng, '{}[]:,"\\ 0123456789.eE+-tfnrulasu\n\r\t\x01')
    assert is_complete(advance(START, text)) == reference_accepts(text), text


def test_deep_nesting_closes_each_container_with_its_own_bracket():
    value: object = {}
    for depth in range(60):
        value = {"k": [value]} if depth % 2 else {"k": value}
    text = json.dumps(value, separators=(",", ":"))
    assert is_complete(advance(START, text)) and reference_accepts(text)
    first_close = text.index("}")
    for wrong in ("]", ","):
        swapped = text[:first_close] + wrong
        assert advance(START, swapped) is None and not reference_accepts(swapped + text[first_close + 1:])


def test_without_whitespace_only_compact_texts_are_complete():
    compact = JsonGrammar(OBJECT_SCHEMA, whitespace=False)
    for text in HAND_CASES:
        tight = reference_accepts(text) and not whitespace_runs(text)
        assert compact.is_complete(compact.advance(compact.start, text)) == tight, text
