"""tool_choice "required" holds each call's arguments to its own tool's `parameters`, exactly as a
named tool choice does, whatever local $refs the tools use ("#", draft-07 "definitions",
"#/properties/..."): checked without a model, the guide's JSON grammar against the jsonschema
library validating each call's arguments against its tool's schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.server.errors import APIError
from inferlab.server.protocol import ChatCompletionRequest
from inferlab.server.settings import ServerSettings
from inferlab.server.tools import tool_use

TREE = {"type": "object", "required": ["v", "child"], "properties": {
    "v": {"type": "integer"}, "child": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}}
DRAFT7 = {"type": "object", "definitions": {"c": {"enum": ["a", "b"]}},
          "properties": {"x": {"$ref": "#/definitions/c"}}, "required": ["x"]}
SAME_AS = {"type": "object", "required": ["a", "b"], "properties": {
    "a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}}
WORD = {"type": "object", "$defs": {"c": {"enum": ["a"]}}, "properties": {"x": {"$ref": "#/$defs/c"}}}
NUMBER = {"type": "object", "$defs": {"c": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/c"}}}
NAMED = {"$id": "https://example.com/flag.json", "type": "object", "required": ["on"],
         "properties": {"on": {"$ref": "#/$defs/flag"}}, "$defs": {"flag": {"type": "boolean"}}}
TOOLS = {"tree": TREE, "pick": DRAFT7, "pair": SAME_AS, "word": WORD, "number": NUMBER,
         "a/b~": NAMED}  # "/" and "~" are escaped in a JSON pointer


def request(tools: dict[str, Any], choice: Any = "required") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": choice,
        "tools": [{"type": "function", "function": {"name": name, "parameters": schema}}
                  for name, schema in tools.items()]})


def guide(tools: dict[str, Any], choice: Any = "required") -> JsonGrammar:
    return JsonGrammar(tool_use(request(tools, choice), ServerSettings(served_model_name="m")).schema)


def calls_valid(calls: list[dict[str, Any]]) -> bool:
    """The reference: calls of the tools in order name, parameters, each one's arguments valid
    against its own tool's schema."""
    return bool(calls) and all(
        list(call) == ["name", "parameters"] and call["name"] in TOOLS
        and jsonschema.Draft202012Validator(TOOLS[call["name"]]).is_valid(call["parameters"])
        for call in calls)


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"name": name, "parameters": arguments}


CASES = [
    [call("tree", {"v": 1, "child": None})],
    [call("tree", {"v": 1, "child": {"v": 2, "child": {"v": 3, "child": None}}})],
    [call("tree", {"v": 1, "child": [call("tree", {"v": 2, "child": None})]})],  # the calls array
    [call("tree", {"v": 1, "child": call("tree", {"v": 2, "child": None})})],
    [call("pick", {"x": "b"})], [call("pick", {"x": "c"})], [call("pick", {})],
    [call("pair", {"a": 1, "b": 2})], [call("pair", {"a": 1, "b": "2"})],
    [call("word", {"x": "a"}), call("number", {"x": 5})],  # a $defs name the two tools share
    [call("word", {"x": 5})], [call("number", {"x": "a"})],
    [call("a/b~", {"on": True})], [call("a/b~", {"on": 1})],
    [call("tree", {"v": 1, "child": None}), call("pick", {"x": "a"}), call("pair", {"a": 0, "b": -4})],
    [],
]


def test_required_calls_hold_each_tools_arguments_to_its_own_schema():
    grammar = guide(TOOLS)
    for calls in CASES:
        text = json.dumps(calls)
        state = grammar.advance(grammar.start, text)
        assert grammar.is_complete(state) == calls_valid(calls), text


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_required_call_takes_what_the_named_choice_takes(name):
    named = guide(TOOLS, {"type": "function", "function": {"name": name}})
    required = guide(TOOLS)
    for calls in CASES:
        for arguments in (c["parameters"] for c in calls if c["name"] == name):
            alone = named.is_complete(named.advance(named.start, json.dumps(arguments)))
            text = json.dumps([call(name, arguments)])
            assert required.is_complete(required.advance(required.start, text)) == alone, text


def test_a_tool_schema_the_guide_cannot_hold_is_refused_naming_the_tool():
    broken = {"type": "object", "properties": {"x": {"$ref": "#/definitions/missing"}}}
    with pytest.raises(APIError) as refused:
        guide({"pick": DRAFT7, "broken": broken})
    assert (refused.value.status, refused.value.param) == (400, "tools.1.function.parameters")
    assert refused.value.message.startswith("tool 'broken': parameters: $ref '#/definitions/missing'")
