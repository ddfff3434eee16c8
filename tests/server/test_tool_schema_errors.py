"""A tool's `parameters` the server cannot guide a call by is refused at request time with a 400
that names it, never a 500 nor a call with broken arguments: OpenAI takes a function's parameters
as a JSON schema of an object (a missing one: no arguments), and a forced call's arguments are
that object, so a schema of another type is refused, and a schema nested past what the guide
compiles is refused as response_format's json_schema is ("nested too deeply")."""

from __future__ import annotations

from typing import Any

import pytest
from test_server_errors import chat, check_error

from inferlab.engine.guided.json_grammar import JsonGrammar
from inferlab.server.errors import APIError
from inferlab.server.protocol import ChatCompletionRequest
from inferlab.server.settings import ServerSettings
from inferlab.server.tools import tool_use

NAMED = {"type": "function", "function": {"name": "f"}}
SETTINGS = ServerSettings(served_model_name="m", enable_auto_tool_choice=True, tool_call_parser="hermes")
FREE = {"type": "function", "function": {"name": "g"}}  # tools[0], with no parameters: fine


def nested(depth: int) -> dict[str, Any]:
    """{"type": "object", "properties": {"a": ...}} `depth` times around an integer."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP = nested(400)  # compiling takes several frames a level: far past Python's 1000
BROKEN = {"type": "object", "properties": {"x": {"$ref": "#/definitions/missing"}}}  # no guide


def tools_with(parameters: Any) -> list[dict[str, Any]]:
    """A free tool, then "f" (tools[1]) with the given parameters (None: none given)."""
    function = {"name": "f"} if parameters is None else {"name": "f", "parameters": parameters}
    return [FREE, {"type": "function", "function": function}]


def use(parameters: Any, choice: Any):
    return tool_use(ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": choice,
        "tools": tools_with(parameters)}), SETTINGS)


def refusal(parameters: Any, choice: Any) -> APIError:
    with pytest.raises(APIError) as refused:
        use(parameters, choice)
    assert refused.value.status == 400
    return refused.value


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_parameters_nested_too_deeply_are_a_400_naming_the_tool(choice):
    error = refusal(DEEP, choice)
    assert error.param == "tools.1.function.parameters"
    assert error.message == "tool 'f': parameters: nested too deeply"


@pytest.mark.parametrize("choice", ["required", NAMED, "auto", "none"])
@pytest.mark.parametrize("parameters", [{"type": "integer"}, {"type": "boolean"},
                                        {"type": "integer", "minimum": 0, "maximum": 9},
                                        {"type": ["object", "null"]}])
def test_parameters_of_another_type_than_object_are_refused(parameters, choice):
    error = refusal(parameters, choice)
    assert error.param == "tools.1.function.parameters"
    assert error.message.startswith("tools.1.function.parameters (tool 'f') must be a JSON schema "
                                    f"of an object: got type {parameters['type']!r}")


@pytest.mark.parametrize("choice", ["required", NAMED])
@pytest.mark.parametrize("parameters", [{"anyOf": [{"type": "object"}, {"type": "integer"}]},
                                        {"$ref": "#/$defs/n", "$defs": {"n": {"type": "number"}}}])
def test_a_forced_call_refuses_parameters_that_also_take_other_values(parameters, choice):
    """No type declared, but the schema takes more than objects: the guide could write 5."""
    error = refusal(parameters, choice)
    assert error.param == "tools.1.function.parameters"
    assert "also takes values that are not objects" in error.message


@pytest.mark.parametrize("parameters", [{}, {"anyOf": [{"type": "object"}, {"type": "integer"}]}])
def test_auto_leaves_an_undeclared_type_to_the_model(parameters):
    assert use(parameters, "auto").parser is not None


def guide_takes(parameters: Any, text: str) -> bool:
    grammar = JsonGrammar(use(parameters, NAMED).schema)
    return grammar.is_complete(grammar.advance(grammar.start, text))


def test_an_empty_schema_holds_a_forced_call_to_any_object():
    """{} takes any JSON value; a call's arguments are an object, so the guide holds it to one."""
    assert guide_takes({}, '{"x": [1, "y"]}')
    assert not guide_takes({}, "5")


def test_properties_without_a_type_hold_a_forced_call_to_an_object():
    """JSON Schema takes 5 for {"properties": ...} (it only says what an object's keys hold); the
    forced call's arguments are an object."""
    parameters = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert guide_takes(parameters, '{"a": 1}')
    assert not guide_takes(parameters, "5")
    assert not guide_takes(parameters, '{"a": "x"}')


def test_no_parameters_still_mean_no_arguments():
    assert guide_takes(None, "{}")
    assert not guide_takes(None, '{"a": 1}')


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}],
      "tool_choice": "required"}, "tools.0.function.parameters", "nested too deeply"),
    ({"tools": tools_with(DEEP), "tool_choice": NAMED}, "tools.1.function.parameters",
     "nested too deeply"),
    ({"tools": tools_with(BROKEN), "tool_choice": "required"}, "tools.1.function.parameters",
     "$ref '#/definitions/missing'"),
    ({"tools": tools_with({"type": "integer"}), "tool_choice": "required"},
     "tools.1.function.parameters", "got type 'integer'"),
    ({"tools": tools_with({"type": "boolean"}), "tool_choice": NAMED},
     "tools.1.function.parameters", "got type 'boolean'"),
])
def test_the_server_answers_400_not_500(server, fields, param, words):
    assert words in check_error(chat(server, max_tokens=1, **fields), 400, param)
