"""A chat request's tools, read as vLLM reads them: which tool_choice applies, what the chat
template is given, the JSON schema a forced call holds the reply to, and the parser that reads
the calls out of the reply (tool_parsers.py, tool_call_formats.py).

- "none": the reply is plain text (the template still sees the tools, unless the server runs
  with --exclude-tools-when-tool-choice-none);
- a named function: the reply is that function's arguments, held to its `parameters`;
- "required": one or more calls, held to a JSON array of {"name", "parameters"} objects (at most
  one with parallel_tool_calls false);
- "auto" (the default when tools are given): the model decides; the server's
  --tool-call-parser reads its calls out of the text, so "auto" needs
  --enable-auto-tool-choice, as in vLLM.

A tool's `parameters` is a JSON schema of an object, as OpenAI requires (a call's arguments are
one): a schema that declares another type is refused, and so, for a forced call, is one that
takes other values too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferlab.engine.guided.json_nodes import LiteralNode, Node, ObjectNode, UnionNode
from inferlab.engine.guided.json_schema import OBJECT_SCHEMA, SchemaError, compile_schema
from inferlab.server.errors import APIError, bad_request
from inferlab.server.protocol import ChatCompletionRequest
from inferlab.server.settings import ServerSettings
from inferlab.server.tool_call_formats import AUTO_PARSERS
from inferlab.server.tool_parsers import NamedCall, RequiredCalls, ToolParser

_NO_ARGUMENTS = {"type": "object", "properties": {}}
_ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description"}  # say nothing of the values


@dataclass(frozen=True)
class ToolUse:
    template_tools: list[dict[str, Any]] | None  # the chat template's `tools`
    schema: dict[str, Any] | None  # the reply's guide (a forced call)
    parser: Callable[[], ToolParser] | None  # one per choice; None: the reply is plain text
    markers: tuple[str, ...] = ()  # texts the parser looks for


def tool_use(req: ChatCompletionRequest, settings: ServerSettings) -> ToolUse:
    tools = {t.function.name: t for t in req.tools or ()}
    if len(tools) < len(req.tools or ()):
        raise bad_request("tool names must be unique", "tools")
    for index, tool in enumerate(req.tools or ()):
        _check_declared_object(tool.function.parameters, tool.function.name, index)
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    template_tools = None if req.tools is None else [t.model_dump(exclude_none=True) for t in tools.values()]
    if choice == "none" or (choice == "auto" and req.tools == []):  # nothing to call: text
        hidden = settings.exclude_tools_when_tool_choice_none
        return ToolUse(None if hidden else template_tools, None, None)
    if not tools:
        raise bad_request("tool_choice needs 'tools'", "tool_choice")
    if choice == "auto":
        if settings.tool_call_parser is None or not settings.enable_auto_tool_choice:
            raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set", "tool_choice")
        parser = AUTO_PARSERS[settings.tool_call_parser]
        return ToolUse(template_tools, None, parser, parser.markers)
    if _guided(req):
        raise bad_request("a forced tool call sets the reply's form: it cannot be combined with "
                          "response_format, structured_outputs or guided_* fields", "tool_choice")
    parameters = {name: _parameters(t.function.parameters, name, index)
                  for index, (name, t) in enumerate(tools.items())}
    if choice == "required":
        limit = {"maxItems": 1} if req.parallel_tool_calls is False else {}
        return ToolUse(template_tools, _calls_schema(parameters, limit), RequiredCalls)
    name = _named(choice)
    if name not in tools:
        raise bad_request(f"tool {name!r} is not among the request's tools", "tool_choice")
    return ToolUse(template_tools, parameters[name], lambda: NamedCall(name))


def _named(choice: Any) -> str:
    """The function a tool_choice object names; a string other than the four is refused."""
    function = choice.get("function") if isinstance(choice, dict) else None
    if (not isinstance(function, dict) or choice.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", '
                          '"function": {"name": ...}}', "tool_choice")
    return function["name"]


def _check_declared_object(schema: dict[str, Any] | None, name: str, index: int) -> None:
    """OpenAI takes a function's parameters as a JSON schema of an object only: one that declares
    another type is refused, whatever the tool choice (no `type` is read as the schema's other
    keywords make it, as JSON Schema reads it)."""
    declared = (schema or {}).get("type", "object")
    if declared not in ("object", ["object"]):
        raise _not_an_object(name, index, f"got type {declared!r}")


def _parameters(schema: dict[str, Any] | None, name: str, index: int) -> dict[str, Any]:
    """A function's parameters schema (no parameters: an empty object), refused now, naming the
    tool, when the guide cannot hold a reply to it or would hold it to something other than an
    object: the calls' parsers read the arguments as one."""
    if schema is None:
        schema = _NO_ARGUMENTS
    elif not schema.keys() - _ANNOTATIONS:  # {}: a function taking anything, which as a call's
        schema = OBJECT_SCHEMA               # arguments is any object
    field = f"tools.{index}.function.parameters"  # the error names the field, as _not_an_object does
    try:
        nodes = compile_schema(schema)
    except SchemaError as e:
        raise bad_request(f"tool {name!r}: parameters: {e}", field) from None
    except RecursionError:  # as sampling_params refuses a guide nested past Python's stack
        raise bad_request(f"tool {name!r}: parameters: nested too deeply", field) from None
    if not _objects_only(nodes, 0):
        raise _not_an_object(name, index, 'it also takes values that are not objects (give it "type": "object")')
    return schema


def _objects_only(nodes: tuple[Node, ...], index: int) -> bool:
    """Whether every value a compiled schema's node takes is a JSON object."""
    node = nodes[index]
    if isinstance(node, UnionNode):
        return all(_objects_only(nodes, option) for option in node.options)
    if isinstance(node, LiteralNode):
        return all(text.startswith("{") for text in node.texts)
    return isinstance(node, ObjectNode)


def _not_an_object(name: str, index: int, why: str) -> APIError:
    field = f"tools.{index}.function.parameters"
    return bad_request(f"{field} (tool {name!r}) must be a JSON schema of an object: {why}", field)


def _calls_schema(parameters: dict[str, dict[str, Any]], limit: dict[str, int]) -> dict[str, Any]:
    """vLLM's schema for tool_choice "required": an array of calls, each one of the tools by
    name with its parameters. Each tool's parameters move to the root's $defs under its name,
    their local $refs ("#", "#/definitions/...") rewritten to point there, so that they hold
    the arguments as the tool's own schema does."""
    places = {name: f"#/$defs/{_pointer_part(name)}" for name in parameters}
    calls = [{"type": "object", "required": ["name", "parameters"], "properties": {
        "name": {"enum": [name]}, "parameters": {"$ref": place}}} for name, place in places.items()]
    # a root $id names the tool's schema alone: below the root it would be an embedded resource
    definitions = {name: _moved({k: v for k, v in schema.items() if k != "$id"}, places[name])
                   for name, schema in parameters.items()}
    return {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **limit,
            "$defs": definitions}


def _pointer_part(name: str) -> str:
    """A key as one part of a JSON pointer (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


def _moved(schema: Any, place: str) -> Any:
    """A (sub)schema of a schema moved to the JSON pointer `place`: its local $refs point where
    their targets now sit. enum and const hold JSON values, not schemas: they stay as they are;
    properties, $defs and definitions hold schemas under names that are not keywords."""
    if isinstance(schema, list):
        return [_moved(item, place) for item in schema]
    if not isinstance(schema, dict):
        return schema
    moved = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            moved[key] = place + value[1:]
        elif key in ("enum", "const"):
            moved[key] = value
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            moved[key] = {name: _moved(sub, place) for name, sub in value.items()}
        else:
            moved[key] = _moved(value, place)
    return moved


def _guided(req: ChatCompletionRequest) -> bool:
    fields = (req.guided_choice, req.guided_json, req.guided_regex, req.guided_grammar)
    text_format = (req.response_format or {}).get("type", "text") == "text"
    return any(f is not None for f in fields) or bool(req.structured_outputs) or not text_format

