"""The schema-held JSON recognizer against the jsonschema library, the reference validator.

A text is complete exactly when json.loads reads it (nothing around it, no NaN, whitespace runs in
bounds: gaps_in_bounds) and jsonschema validates the value against the schema read with the
grammar's documented stricter rules (json_reference.py). Random walks through the grammar end
only in texts the reference validates, and never reach a state from which nothing goes on.
The cases on string formats and pattern semantics are in test_json_schema_strings.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.engine.guided.json_schema import SchemaError, compile_schema

from .grammar_fuzz import complete, edit, finished_walks, read_whole
from .json_reference import Reference, reference_accepts

PERSON = {
    "type": "object", "title": "Person", "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "description": "full name"},
        "age": {"type": "integer"},
        "score": {"enum": [1, 10, 1.5, "a b", None, True]},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string"},
                                                  "zip": {"type": ["integer", "null"]}}},
        "ok": {"type": "boolean"},
        "ratio": {"type": "number"},
    },
}
TREE = {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node"}
MIXED = {"type": "object", "properties": {"id": {"type": "string"}},
         "additionalProperties": {"type": "integer"}}
NEEDS_OTHER = {**MIXED, "required": ["n"]}  # a required key that only additionalProperties takes
PAIR = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
CHOICE = {"enum": [1, 12, "a b", -0.5, None]}
PYDANTIC = {  # what pydantic's model_json_schema() writes for a model with a nested model
    "$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
                                     "legs": {"default": 4, "title": "Legs", "type": "integer"}},
                      "required": ["kind"], "title": "Pet", "type": "object"}},
    "properties": {"owner": {"title": "Owner", "type": "string"},
                   "pet": {"allOf": [{"$ref": "#/$defs/Pet"}]},
                   "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
    "required": ["owner", "pet"], "title": "Home", "type": "object"}
PATTERNED = {"type": "object", "required": ["code"], "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"}, "tag": {"pattern": "ab|\u00e9"}}}
BOUNDED = {"type": "object", "required": ["age"], "properties": {
    "age": {"type": "integer", "minimum": 18, "maximum": 120},
    "t": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 0.1},
    "k": {"type": "integer", "exclusiveMinimum": -30, "maximum": -7, "minimum": -40},
    "code": {"type": "string", "minLength": 2, "maxLength": 4},
    "word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
    "row": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 1}],
            "items": False},
    "log": {"type": "array", "prefixItems": [{"const": "v1"}], "items": {"type": "number", "minimum": 0.5},
            "minItems": 2}}}
# once refused: a false subschema anywhere ("the schema false matches nothing"), and a $ref's
# percent-escapes or array index ("points at nothing"), which jsonschema resolves
FALSES = {"type": "object", "properties": {"a": False, "b": {"anyOf": [False, {"type": "integer"}]}}}
# once refused too: schemas built of false alone, which take nothing as false does
NOTHINGS = {"$defs": {"no": False, "none": {"anyOf": [False, {"$ref": "#/$defs/no"}]}},
            "type": "object", "properties": {
                "a": {"$ref": "#/$defs/no"}, "c": {"anyOf": [False]}, "e": {"allOf": [{"$ref": "#/$defs/none"}]},
                "b": {"anyOf": [{"$ref": "#/$defs/no"}, {"type": "integer"}]},
                "d": {"oneOf": [False, {"$ref": "#/$defs/none"}, {"type": "null"}]},
                "t": {"type": "array", "prefixItems": [{"type": "integer"}, {"anyOf": [False]}],
                      "items": {"type": "string"}}}}
POINTERS = {"$defs": {"e f": {"type": "null"}, "a%b": {"type": "integer"},
                      "u": {"anyOf": [{"type": "string"}, {"type": "boolean"}]}},
            "type": "object", "required": ["x"],
            "properties": {"x": {"$ref": "#/$defs/e%20f"}, "y": {"$ref": "#/$defs/a%25b"},
                           "w": {"$ref": "#/$defs/u/anyOf/1"}}}
# %2F is a / once the fragment is decoded, as jsonschema reads it: #/$defs/a/b, not the key "a/b"
SLASHED = {"$defs": {"a/b": {"type": "string"}, "a": {"b": {"type": "integer"}}}, "$ref": "#/$defs/a%2Fb"}
NO_EXTRA = {"$defs": {"no": False}, "type": "object", "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"anyOf": [{"$ref": "#/$defs/no"}]}}  # as additionalProperties: false
SCHEMAS = {"person": PERSON, "tree": TREE, "mixed": MIXED, "needs_other": NEEDS_OTHER, "pair": PAIR, "choice": CHOICE,
           "pydantic": PYDANTIC, "patterned": PATTERNED, "bounded": BOUNDED, "falses": FALSES, "nothings": NOTHINGS,
           "no_extra": NO_EXTRA,
           "pointers": POINTERS, "slashed": SLASHED}

VALID = {
    "person": [{"name": "Zoë \"Z\"\n", "age": -3}, {"name": "", "age": 0, "score": 10, "nick": None,
               "tags": ["x", "y z"], "home": {"city": "Oslo", "zip": None}, "ok": False, "ratio": -2.5e-3},
               {"name": "a", "age": 7, "score": 1.5, "tags": ["t"], "home": {}}],
    "tree": [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4}]}]}],
    "mixed": [{}, {"id": "a", "n": 3, "m": -1}, {"id": "b", "x": 1}],
    "needs_other": [{"n": 0}, {"id": "a", "n": 3, "m": -1}, {"id": "b", "n": 2, "x": 1}],
    "pair": [[1, 2.5], [-0.0, 1e10]],
    "choice": [1, 12, "a b", -0.5, None],
    "patterned": [{"code": "AB-12"}, {"code": "ZZ-999", "tag": "x\u00e9\n"}, {"code": "QQ-00", "tag": "abab"}],
    "bounded": [{"age": 18}, {"age": 120, "t": -2.4999, "k": -8, "code": "ab", "word": "xyz", "row": [0, "a"],
                 "log": ["v1", 0.5, 7]}, {"age": 99, "t": 0.09, "k": -29, "code": "\u00e9\"\n\u00e9", "word": "a",
                 "row": [], "log": ["v1", 12.25]}, {"age": 20, "t": -0.0, "k": -7, "row": [31]}],
    "pydantic": [{"owner": "Ann", "pet": {"kind": "cat"}},
                 {"owner": "Bo", "pet": {"kind": "dog", "legs": 3}, "note": None}],
    "falses": [{}, {"b": -4}],
    "nothings": [{}, {"b": 2, "d": None}, {"t": []}, {"t": [5]}],
    "no_extra": [{}, {"a": 3}],
    "pointers": [{"x": None}, {"x": None, "y": 3, "w": True}],
    "slashed": [3, -12],
}
LAYOUTS = [{}, {"indent": 2}, {"separators": (",", ":")}, {"separators": (" , ", " :\t")},
           {"indent": "\t", "ensure_ascii": False}]


GRAMMARS = {name: JsonGrammar(schema) for name, schema in SCHEMAS.items()}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_instances_in_every_layout_are_complete_and_every_prefix_viable(name):
    grammar = GRAMMARS[name]
    for value in VALID[name]:
        for layout in LAYOUTS:
            text = json.dumps(value, **layout)
            assert reference_accepts(SCHEMAS[name], text), text  # the cases are valid
            read_whole(grammar, text)


HAND_CASES = {
    "person": ['{"name":"x"}', '{"age":1}', '{"name":"x","age":1.5}', '{"name":"x","age":1.0}',
               '{"name":"x","age":1e2}', '{"name":"x","age":1,"zz":1}', '{"name":"x","name":"y","age":1}',
               '{"name":"x","age":1,"score":100}', '{"name":"x","age":1,"score":15}',
               '{"name":"x","age":1,"score":1.}', '{"name":"x","age":1,"score":"a b"}',
               '{"name":"x","age":1,"score":"a"}', '{"name":"x","age":1,"tags":[]}',
               '{"name":"x","age":1,"tags":["a","b","c","d"]}', '{"name":"x","age":1,"tags":[1]}',
               '{"name":"x","age":1,"home":{"zip":"1"}}', '{"name":"x","age":1,"ok":null}',
               '{"name":1,"age":1}', '{"name":"x","age":01}', '{"name":"x","age":-}', ' {"name":"x","age":1}',
               '{"name":"x","age":1} ', '{"name":"x","age":1,}', '{"name":"x",,"age":1}', "{}", "[]", "null",
               '{"age":1,"name":"x"}', '{"name":"x","age":1,"ok":true,"tags":["a"]}',
               '{"name":"x","age":1,"home":{"zip":1,"city":"a"}}'],
    "tree": ['{"kids":[],"v":1}', '{"v":1,"kids":[{"kids":[],"v":2}]}', '{"v":1,"kids":[{}]}', '{"v":1,"kids":[{"v":"2"}]}', '{"v":1,"kids":{"v":2}}', '{"kids":[]}'],
    "needs_other": ['{"n":1,"id":"a"}', '{"id":"a","m":2,"n":1}', '{}', '{"id":"a"}', '{"m":1}', '{"n":"x"}',
                    '{"n":1,"n":2}'],
    "mixed": ['{"n":1,"id":"a"}', '{"id":"a","n":1,"m":2}', '{"id":1}', '{"n":"x"}', '{"id":"a","id":"b"}', '{"n":1.5}', '{"\\u0069d":"a"}',
              '{"\\u0069d":2}', '{"n":1,"n":2}'],
    "pair": ["[1]", "[1,2,3]", "[1,2]", "[1, 2 ]", "[ 1,2]", '[1,"2"]', "[]"],
    "choice": ["1", "12", "123", "2", '"a b"', '"a"', "1 ", "-1", "-0.50", "-0.5", "nul"],
    "patterned": ['{"code":"AB-1"}', '{"code":"ab-12"}', '{"code":"AB-1234"}', '{"code":"AB-12","tag":"a"}',
                  '{"code":"AB-12","tag":"\\u00e9"}', '{"code":"AB-12","tag":"\\u0061b"}',
                  '{"code":"AB\\u002d12"}', '{"code":"AB-12","tag":"\\u00e"}', '{"code":"AB-12\\n"}'],
    "bounded": ['{"age":17}', '{"age":121}', '{"age":18.0}', '{"age":1}', '{"age":180}', '{"age":-18}',
                '{"age":20,"t":0.1}', '{"age":20,"t":-2.5}', '{"age":20,"t":0.099999999999999}',
                '{"age":20,"t":0.09999999999999999999}', '{"age":20,"t":1e-3}', '{"age":20,"t":-0}',
                '{"age":20,"k":-30}', '{"age":20,"k":-41}', '{"age":20,"k":-6}', '{"age":20,"k":-7.5}',
                '{"age":20,"code":"a"}', '{"age":20,"code":"abcde"}', '{"age":20,"code":"\\u00e9"}',
                '{"age":20,"code":"\\ud83d\\ude00"}', '{"age":20,"code":"😀😀"}',
                '{"age":20,"word":"abcd"}', '{"age":20,"word":"A"}', '{"age":20,"word":""}',
                '{"age":20,"row":[0,"a","b"]}', '{"age":20,"row":[-1]}', '{"age":20,"row":["a"]}',
                '{"age":20,"row":[1,"ab"]}', '{"age":20,"log":["v1"]}', '{"age":20,"log":["v1",0.4]}',
                '{"age":20,"log":[0.5,0.5]}', '{"age":20,"log":["v1",0.5,"v1"]}'],
    "no_extra": ['{"b":1}', '{"a":1,"b":null}'],
    "nothings": ['{"a":1}', '{"c":null}', '{"e":0}', '{"b":"x"}', '{"d":1}', '{"t":[1,"x"]}', '{"t":["x"]}',
                 '{"t":[1,2]}'],
    "pydantic": ['{"pet":{"kind":"cat"},"owner":"a"}', '{"owner":"a","pet":{"legs":3,"kind":"dog"}}',
                 '{"owner":"a","pet":{"kind":"cow"}}', '{"owner":"a","pet":{"legs":4}}',
                 '{"owner":"a","pet":{"kind":"cat"},"note":3}'],
}


@pytest.mark.parametrize("name", sorted(HAND_CASES))
def test_hand_cases_agree_with_jsonschema(name):
    for text in HAND_CASES[name] + [json.dumps(v) for v in VALID[name]]:
        assert complete(GRAMMARS[name], text) == reference_accepts(SCHEMAS[name], text), text


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(VALID)), st.integers(0, 4), st.randoms())
def test_edited_texts_are_complete_exactly_when_jsonschema_validates(name, layout, rng):
    text = edit(json.dumps(rng.choice(VALID[name]), **LAYOUTS[layout]), rng,
                '{}[]:,"\\ 0123456789.eE+-tfnrulasuvkidg\n')
    assert complete(GRAMMARS[name], text) == reference_accepts(SCHEMAS[name], text), text


ALPHABET = sorted(set('{}[]:,"\\ \n0123456789.eE+-truefalsnu/bfnrtxyz') | set(
    "".join(json.dumps(SCHEMAS, ensure_ascii=False))))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_walks_end_only_in_texts_jsonschema_validates(name):
    texts = finished_walks(GRAMMARS[name], random.Random(name), 60, budget=60, alphabet=ALPHABET)
    assert len(texts) >= 50
    for text in texts:
        assert reference_accepts(SCHEMAS[name], text), text


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "integer", "multipleOf": 2}, "keyword 'multipleOf' is not supported"),
    ({"type": "array", "uniqueItems": True}, "keyword 'uniqueItems' is not supported"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength (3) is above maxLength (2)"),
    ({"type": "string", "maxLength": 1.5}, "maxLength must be a non-negative integer"),
    ({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 2}, "no integer the grammar writes lies within "
     "minimum 1.5, exclusiveMaximum 2"),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-16},  # 16 digits: 0.0000000000000001
     "no number the grammar writes lies within exclusiveMinimum 0, exclusiveMaximum 1e-16"),
    ({"type": "number", "minimum": 0, "exclusiveMaximum": 0}, "lies within minimum 0, exclusiveMaximum 0"),
    ({"type": "number", "exclusiveMinimum": True}, "exclusiveMinimum must be a finite number, got True"),
    ({"type": "array", "prefixItems": {"type": "string"}}, "prefixItems must be a list of schemas"),
    ({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2}, "minItems (2) is above the 1 items"),
    (False, "matches nothing"),
    ({"type": "string", "pattern": "[^\\s\\S]"}, "it matches no text"),
    ({"type": "date"}, "type must be one of"),
    ({"$ref": "http://example.com/s.json"}, "only references inside the schema"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "refers to itself"),
    ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "cycle that reads no character"),
    ({"type": "object", "required": ["a"]}, "required key 'a' is not in properties"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems (3) is above maxItems (2)"),
    ({"type": "array", "maxItems": -1}, "maxItems must be a non-negative integer"),
    ({"enum": []}, "enum must be a non-empty list"),
    ({"type": "string", "enum": [1, 2]}, "no value of enum/const is of type string"),
    ({"enum": [float("nan")]}, "is not a JSON value"),
    ({"allOf": [{"type": "string"}, {"type": "null"}]}, "allOf with more than one"),
    ({"type": "string", "anyOf": [{"type": "null"}]}, "anyOf cannot be combined with type"),
    ("string", "a schema must be an object or a boolean"),
    ({"type": "string", "format": "iri"}, "format 'iri' is not supported"),
    ({"type": "string", "format": "date", "pattern": "a"}, "pattern and format cannot be combined"),
    ({"type": "string", "pattern": "(a"}, "pattern '(a': missing ')'"),
    ({"type": "string", "pattern": "a\\1"}, "backreference"),
    # a date is 10 characters, a time at least 9 ("00:00:00Z"), [a-c]+ at least 1
    ({"type": "string", "format": "date", "maxLength": 5},
     "no string that format 'date' matches has a length within maxLength 5"),
    ({"type": "string", "pattern": "^[a-c]+$", "maxLength": 0},
     "no string that pattern '^[a-c]+$' matches has a length within maxLength 0"),
    ({"type": "string", "format": "time", "minLength": 1, "maxLength": 1}, "within minLength 1, maxLength 1"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date", "maxLength": 5}}},
     "no string that format 'date' matches"),  # once the grammar took the key, then dead-ended
    ({"enum": [1, 2], "const": 3}, "const 3 is not one of enum's values"),
    ({"enum": [True, "1"], "const": 1}, "const 1 is not one of enum's values"),  # true is not 1
    ({"$defs": {"z": {"type": "integer"}, "inner": {"$id": "http://example.com/inner", "$defs": {
        "z": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/z"}}}}, "$ref": "#/$defs/inner"},
     "$id below the root schema"),  # its #/$defs/z is inner's, a string
    ({"$defs": {"inner": {"$id": "inner.json", "properties": {"a": {"type": "integer"}}}},
      "$ref": "#/$defs/inner/properties/a"}, "$ref '#/$defs/inner/properties/a' reaches $id 'inner.json'"),
    ({"type": "object", "properties": {"a": {"$id": "a.json", "type": "integer"}}}, "$id 'a.json': $id below"),
    ({"type": "string", "format": ["date"]}, "format ['date'] is not supported"),
    ({"type": "object", "required": ["a"], "properties": {"a": False}}, "property 'a' has the schema false"),
    ({"type": "object", "properties": {"a": False}, "additionalProperties": True},
     "property 'a' has the schema false"),  # an extra key "a" would get past it
    ({"anyOf": [False, False]}, "every branch of anyOf is the schema false"),
    ({"anyOf": [{"anyOf": [False]}, {"$defs": {}, "$ref": "#/$defs/x"}]}, "points at nothing"),
    ({"type": "object", "required": ["a"], "properties": {"a": {"anyOf": [False]}}},
     "property 'a' has the schema false"),
    ({"type": "array", "prefixItems": [{}, {"$ref": "#/$defs/no"}], "minItems": 2, "$defs": {"no": False}},
     "minItems (2) is above the 1 items that the schema false allows"),
])
def test_what_the_grammar_cannot_hold_is_refused_by_name(schema, words):
    with pytest.raises(SchemaError, match=re.escape(words)):
        compile_schema(schema)


def test_a_refused_keyword_at_its_neutral_value_is_read_as_absent():
    for neutral, plain, text in (
            ({"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
             {"type": "array", "items": {"type": "integer"}}, "[1,1]"),
            ({"type": "object", "minProperties": 0}, {"type": "object"}, "{}"),
            ({"uniqueItems": False}, {}, '"x"')):
        assert compile_schema(neutral) == compile_schema(plain)
        assert complete(JsonGrammar(neutral), text) and Reference(neutral).is_valid(json.loads(text))
    for constraining in ({"type": "array", "uniqueItems": True}, {"type": "object", "minProperties": 1},
                         {"type": "array", "uniqueItems": 0}):
        with pytest.raises(SchemaError, match="is not supported"):
            compile_schema(constraining)


def test_an_enum_s_arrays_and_objects_are_written_compactly():
    grammar = JsonGrammar({"type": "object", "properties": {"v": {"enum": [[1, 2], {"k": None}]}}})
    for text, whole in (('{"v":[1,2]}', True), ('{"v": {"k":null} }', True), ('{"v":[1, 2]}', False),
                        ('{"v":{"k": null}}', False), ('{"v":[1]}', False)):
        assert complete(grammar, text) == whole, text


def test_an_empty_schema_takes_any_value_and_types_follow_their_keywords():
    anything = JsonGrammar({})
    for text in ('"s"', "-1.5e3", "[{}]", "null", '{"a":[true]}'):
        assert complete(anything, text), text
    implied = JsonGrammar({"properties": {"a": {"type": "integer"}}})  # no type: an object
    assert implied.is_complete(implied.advance(implied.start, '{"a":1}'))
    assert implied.advance(implied.start, '"a"') is None


@pytest.mark.parametrize(("schema", "texts"), [
    ({"enum": [1, 2], "const": 2}, ["2", "1", "3"]),
    ({"enum": [1.0, "a"], "const": 1}, ["1", '"a"']),  # 1 is 1.0 to JSON Schema
    ({"enum": [[1.0, {"k": True}], 0], "const": [1, {"k": True}]}, ['[1,{"k":true}]', "0"]),
])
def test_const_beside_enum_takes_the_values_both_allow(schema, texts):
    grammar = JsonGrammar(schema)
    for text in texts:
        assert complete(grammar, text) == Reference(schema).is_valid(json.loads(text)), text


def test_an_id_at_the_root_is_an_annotation():
    schema = {"$id": "http://example.com/s", "$defs": {"n": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/$defs/n"}}}
    grammar = JsonGrammar(schema)
    for text in ('{"a":1}', '{"a":"x"}', "{}"):
        assert complete(grammar, text) == reference_accepts(schema, text), text
