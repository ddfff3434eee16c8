"""The structural-tag recognizer against a reference written here from its definition: free text
up to the first place a trigger ends, then one of the begins that start there, a JSON text the
structure's schema takes (test_json_schema's jsonschema-based reference judges it), the end, and
the same again on the rest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.engine.guided.json_schema import SchemaError
from inferlab.engine.guided.structural_tag import StructuralTagGrammar

from .grammar_fuzz import complete, read_whole
from .test_json_schema import reference_accepts

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SPEC = {"structures": [{"begin": "<f=w>", "schema": CITY, "end": "</f>"},
                       {"begin": "<f=n>", "schema": {"type": "integer"}, "end": "</f>"},
                       {"begin": "[n]", "schema": {"type": "integer"}, "end": ""}],
        "triggers": ["<f=", "[n"]}
GRAMMAR = StructuralTagGrammar(SPEC)


def reference(spec: dict, text: str) -> bool:
    """Whether `text` is free text with every triggered structure whole, by the definition."""
    ends = [(text.find(t) + len(t), t) for t in spec["triggers"] if t in text]
    if not ends:
        return True
    start = min(end - len(t) for end, t in ends if end == min(e for e, _ in ends))
    for s in spec["structures"]:
        if not text.startswith(s["begin"], start):
            continue
        body = start + len(s["begin"])
        for stop in range(body + 1, len(text) + 1):
            if text.startswith(s["end"], stop) and reference_accepts(s["schema"], text[body:stop]) \
                    and reference(spec, text[stop + len(s["end"]):]):
                return True
    return False


HAND_CASES = [
    ("", True), ("It is sunny.", True), ("Checking <f=w>{\"city\":\"Paris\"}</f> done", True),
    ('<f=w>{"city":"P"}</f><f=n>-12</f>', True), ("[n]7 and [n]8", True), ("a < b, f = 3", True),
    ("ends in a trigger's start <f", True), ("<f=x>", False), ('<f=w>{"city":"P"}', False),
    ('<f=w>{"city":"P"} </f>', False), ("<f=w>{}</f>", False), ('<f=n>1.5</f>', False),
    ('<<f=n>3</f>', True), ("[n]x", False), ("[n]12", True),
]


@pytest.mark.parametrize(("text", "whole"), HAND_CASES)
def test_hand_cases_agree_with_the_definition(text, whole):
    assert complete(GRAMMAR, text) == whole == reference(SPEC, text)


def test_a_trigger_inside_the_start_of_a_longer_one_still_fires():
    """"ab" is whole in "xab" while "xab!" is still begun: the text goes on as the begin "ab:"."""
    spec = {"structures": [{"begin": "ab:", "schema": {"type": "integer"}, "end": "."},
                           {"begin": "xab!", "schema": {"type": "integer"}, "end": "."}],
            "triggers": ["ab", "xab!"]}
    grammar = StructuralTagGrammar(spec)
    for text in ("xabz", "xab:1.", "xab!2.", "xab!2", "xa b"):
        assert complete(grammar, text) == reference(spec, text), text


PIECES = ["It ", "is ", "<f=w>", "<f=n>", "<f=", "<f", "<", "[n]", "[n", "[", "]", '{"city":"P"}',
          '{"city": "Lyon"}', '{ "city":"P"}', "{}", "7", "-3", "1.5", "</f>", "</", "f>", " ", "\n", "x"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=10))
def test_texts_of_any_shape_are_whole_exactly_when_the_definition_says(parts):
    text = "".join(parts)
    assert complete(GRAMMAR, text) == reference(SPEC, text), text
    if reference(SPEC, text):
        read_whole(GRAMMAR, text)  # and no prefix of it was refused


@pytest.mark.parametrize(("spec", "words"), [
    ({"structures": []}, "structures"),
    ({"structures": [{"begin": "", "schema": {}, "end": "."}], "triggers": ["<"]}, "begin"),
    ({"structures": [{"begin": "<a>", "end": "."}], "triggers": ["<"]}, "schema"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "."}], "triggers": ["["]}, "any trigger"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "."}], "triggers": ["<", "["]}, "trigger '\\[' starts no"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "."}], "triggers": []}, "triggers"),
    ({"structures": [{"begin": "<a>", "schema": {"multipleOf": 2}, "end": "."}], "triggers": ["<"]},
     "multipleOf"),
    # JSON's "\ud800": no token spells a lone surrogate, so the tag could never be written
    ({"structures": [{"begin": "\ud800", "schema": {}, "end": "."}], "triggers": ["\ud800"]}, "surrogate"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "\udfff"}], "triggers": ["<"]}, "surrogate"),
])
def test_a_tag_the_grammar_cannot_hold_is_refused_by_name(spec, words):
    with pytest.raises(SchemaError, match=words):
        StructuralTagGrammar(spec)
