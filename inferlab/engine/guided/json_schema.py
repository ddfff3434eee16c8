"""JSON schemas compiled for guided decoding: one node a (sub)schema, the subset a character-level
recognizer (json_grammar.py) can hold an output to.

The nodes (json_nodes.py) refer to each other by their index in the compiled tuple, so recursive
schemas ($ref) compile. A keyword that would constrain values beyond what the grammar checks
(multipleOf, uniqueItems...) is refused by name, never ignored (at a value that constrains
nothing, NEUTRAL, it is read as absent): every output the grammar lets through validates
against the schema. Where JSON Schema leaves room, the grammar is stricter, and its outputs
still validate:
- a string's `format` is written in one common spelling (json_formats.py: date, time, date-time,
  duration, email, hostname, uuid, ipv4, ipv6, uri); a `pattern` is a search, as jsonschema
  runs it (re.search: each top-level alternative anchored by its own ^ and $), its classes
  read as guided_regex reads them (regex_grammar.py: Python's syntax, \\d, \\w and \\s ASCII's,
  as ECMA-262 reads \\d and \\w, and a class takes only what Python's Unicode reading takes too),
  so jsonschema's Python reading takes every output; each \\u escape is one character; a pattern
  or format that no string of a length within minLength and maxLength matches is refused;
- an object takes keys outside `properties` only when `additionalProperties` is given (true or
  a schema), as OpenAI's structured outputs require; a declared key comes at most once, the
  declared keys in the order of `properties` (then the required keys it does not declare, in
  the order of `required`) and the others after them (ObjectNode), as xgrammar and llguidance
  write objects; where only declared keys may come (no additionalProperties, or a required key
  still to come), a key is spelled one way, no \\u escape JSON does not require, so that no
  key begins that no allowed key goes on from;
- a schema without `type` takes the type its keywords imply (`properties`: object, `items`:
  array), any value when none do;
- `integer` is written without a fraction or exponent; a number with bounds (minimum...)
  without an exponent and, unless an integer, in at most 15 digits (json_numbers.py says why);
- a string's length (minLength, maxLength) counts characters, and a \\u escape of half a
  surrogate pair is not written in a string held to a length or a pattern (the character
  itself is);
- an enum's or const's values are written as one text each, as json.dumps writes them: arrays
  and objects compactly, 0.5 not 0.50;
- `oneOf` is read as `anyOf`, as xgrammar and llguidance read it: where its branches overlap
  ({"oneOf": [{"type": "integer"}, {"type": "number"}]}), an output can match more than one,
  which oneOf forbids;
- a `false` subschema takes nothing, as does one built of false alone (an anyOf of false
  branches, a $ref to false): such an anyOf or oneOf branch is left out, a property whose schema
  it is is a key left out of the object (refused where it is required or additionalProperties
  could bring it back), and an array ends before a prefixItems entry that it is;
- `$id` is taken at the root only: below it, an embedded resource would change what its $refs
  point at, so it is refused by name;
- `enum` beside `const` takes the const if the enum holds it (as JSON compares: 1 is 1.0, true is
  not 1).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from inferlab.engine.guided.json_false_schemas import refs_taking_nothing, takes_nothing
from inferlab.engine.guided.json_keyword_values import (
    SchemaError,
    count_bounds,
    is_type,
    json_equal,
    json_text,
    number_bounds,
    schema_types,
    string_pattern,
)
from inferlab.engine.guided.json_keywords import (
    ANNOTATIONS,
    ARRAY_WORDS,
    NEUTRAL,
    NUMBER_WORDS,
    OBJECT_WORDS,
    STRING_WORDS,
    SUPPORTED,
    TYPES,
)
from inferlab.engine.guided.json_nodes import (
    ArrayNode,
    LiteralNode,
    Node,
    NumberNode,
    ObjectNode,
    StringNode,
    UnionNode,
)

__all__ = ["OBJECT_SCHEMA", "SchemaError", "canonical_text", "compile_schema"]

# any JSON object: json_object's schema, and a tool's arguments where it declares none
OBJECT_SCHEMA = {"type": "object", "additionalProperties": True}

_EMBEDDED_ID = ("{where}: $id below the root schema (an embedded resource, against which its $refs "
                "resolve) is not supported")


def compile_schema(schema: Any) -> tuple[Node, ...]:
    """The schema's nodes, its root first. Raises SchemaError for what the grammar cannot hold."""
    compiler = _Compiler(schema)
    compiler.node(schema)
    nodes = tuple(compiler.nodes)
    _refuse_empty_cycles(nodes)
    return nodes


def canonical_text(schema: Any) -> str:
    """One text for schemas that compile alike: the key of a compiled grammar's cache. Key order
    stays, since the grammar writes `properties` in their order (sorted keys gave a schema the
    grammar of the same properties in another order)."""
    return json.dumps(schema, separators=(",", ":"), default=repr)


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.nodes: list[Node | None] = []
        self.refs: dict[str, int] = {}
        self.takes_nothing: dict[str, bool] | None = None  # per $ref: see refs_taking_nothing
        self.any_node: int | None = None

    def reserve(self) -> int:
        self.nodes.append(None)
        return len(self.nodes) - 1

    def node(self, schema: Any) -> int:
        if schema is True or schema == {}:
            return self.any()
        if schema is False:
            raise SchemaError("the schema false matches nothing")
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object or a boolean, got {schema!r}")
        if schema is not self.root and "$id" in schema:
            raise SchemaError(_EMBEDDED_ID.format(where=f"$id {schema['$id']!r}"))
        schema = {k: v for k, v in schema.items()
                  if not (k in NEUTRAL and v == NEUTRAL[k] and type(v) is type(NEUTRAL[k]))}
        if not schema:
            return self.any()
        unknown = sorted(set(schema) - SUPPORTED - ANNOTATIONS)
        if unknown:
            raise SchemaError(f"JSON schema keyword {unknown[0]!r} is not supported "
                              f"(supported: {', '.join(sorted(SUPPORTED))})")
        words = set(schema) - ANNOTATIONS
        for combinator in ("$ref", "allOf", "anyOf", "oneOf"):
            if combinator in words:
                if len(words) > 1:
                    raise SchemaError(f"{combinator} cannot be combined with "
                                      f"{', '.join(sorted(words - {combinator}))} in one schema")
                return self.combined(combinator, schema[combinator])
        if "enum" in words or "const" in words:
            return self.literal(schema, words)
        return self.typed(schema, words)

    def combined(self, combinator: str, value: Any) -> int:
        if combinator == "$ref":
            return self.ref(value)
        if not isinstance(value, list) or not value:
            raise SchemaError(f"{combinator} must be a non-empty list of schemas")
        if combinator == "allOf":
            if len(value) > 1:
                raise SchemaError("allOf with more than one schema is not supported")
            return self.node(value[0])
        options = [option for option in value if not self.nothing(option)]  # a false branch takes nothing
        if not options:
            raise SchemaError(f"every branch of {combinator} is the schema false: it matches nothing")
        index = self.reserve()
        self.nodes[index] = UnionNode(tuple(self.node(option) for option in options))
        return index

    def nothing(self, schema: Any) -> bool:
        """Whether a schema takes no value at all: false, or built of false alone (an anyOf or
        oneOf whose every branch takes nothing, an allOf with one such, a $ref to one)."""
        if self.takes_nothing is None:
            self.takes_nothing = refs_taking_nothing(self.root, self.resolve)
        return takes_nothing(schema, self.takes_nothing)

    def ref(self, pointer: Any) -> int:
        if pointer in self.refs:
            return self.refs[pointer]
        target = self.resolve(pointer)
        index = self.refs[pointer] = self.reserve()
        resolved = self.nodes[self.node(target)]
        if resolved is None:
            raise SchemaError(f"$ref {pointer!r} refers to itself and to nothing else")
        self.nodes[index] = resolved
        return index

    def resolve(self, pointer: Any) -> Any:
        """The subschema a $ref names."""
        if not isinstance(pointer, str) or not (pointer == "#" or pointer.startswith("#/")):
            raise SchemaError(f"$ref {pointer!r}: only references inside the schema (#/...) are supported")
        target = self.root
        # a URI fragment: its percent-escapes undone first, then read as a JSON pointer (RFC
        # 6901, sections 6 and 4), so %2F separates as / does, as jsonschema reads it
        for part in unquote(pointer[2:]).split("/") if pointer != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, list) and part.isdecimal() and int(part) < len(target):
                target = target[int(part)]
                continue
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"$ref {pointer!r} points at nothing in the schema")
            target = target[part]
            if isinstance(target, dict) and isinstance(target.get("$id"), str):  # not a key named $id
                raise SchemaError(_EMBEDDED_ID.format(where=f"$ref {pointer!r} reaches $id {target['$id']!r}"))
        return target

    def literal(self, schema: dict, words: set[str]) -> int:
        if words - {"enum", "const", "type"}:
            raise SchemaError(f"enum and const cannot be combined with {', '.join(sorted(words - {'enum', 'const', 'type'}))}")
        values = schema.get("enum", [schema.get("const")])
        if not isinstance(values, list) or not values:
            raise SchemaError("enum must be a non-empty list")
        if "const" in schema and "enum" in schema:  # both hold: the const, if the enum takes it
            if not any(json_equal(schema["const"], value) for value in values):
                raise SchemaError(f"const {schema['const']!r} is not one of enum's values")
            values = [schema["const"]]
        types = schema_types(schema.get("type", list(TYPES)))
        texts = dict.fromkeys(json_text(v) for v in values if any(is_type(v, t) for t in types))
        if not texts:
            raise SchemaError(f"no value of enum/const is of type {', '.join(types)}")
        index = self.reserve()
        self.nodes[index] = LiteralNode(tuple(texts))
        return index

    def typed(self, schema: dict, words: set[str]) -> int:
        if "type" in schema:
            types = schema_types(schema["type"])
        elif words & OBJECT_WORDS:
            types = ["object"]
        elif words & ARRAY_WORDS:
            types = ["array"]
        elif words & STRING_WORDS:
            types = ["string"]
        elif words & NUMBER_WORDS:
            types = ["number"]
        else:
            return self.any()
        index = self.reserve()
        built = [self.of_type(t, schema) for t in dict.fromkeys(types)]
        self.nodes[index] = built[0] if len(built) == 1 else UnionNode(tuple(self.add(n) for n in built))
        return index

    def add(self, node: Node) -> int:
        index = self.reserve()
        self.nodes[index] = node
        return index

    def of_type(self, kind: str, schema: dict) -> Node:
        if kind == "object":
            return self.object(schema)
        if kind == "array":
            return self.array(schema)
        if kind in ("number", "integer"):
            return NumberNode(kind == "integer", number_bounds(schema, kind == "integer"))
        if kind == "string":
            low, high = count_bounds(schema, "minLength", "maxLength")
            return StringNode(string_pattern(schema, low, high), low, high)
        return LiteralNode(("true", "false") if kind == "boolean" else ("null",))

    def object(self, schema: dict) -> ObjectNode:
        declared = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(declared, dict) or not all(isinstance(k, str) for k in declared):
            raise SchemaError("properties must map key names to schemas")
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise SchemaError("required must be a list of key names")
        additional = schema.get("additionalProperties", False)
        extra = None if self.nothing(additional) else self.node(additional)
        missing = [k for k in required if k not in declared]
        if missing and extra is None:
            raise SchemaError(f"required key {missing[0]!r} is not in properties, and "
                              "additionalProperties does not allow other keys")
        forbidden = [key for key, value in declared.items() if self.nothing(value)]
        for key in forbidden:  # a key that may not come: left out, where nothing else brings it
            if key in required or extra is not None:
                raise SchemaError(f"property {key!r} has the schema false: supported only for a "
                                  "key not required, without additionalProperties")
        properties = {key: self.node(value) for key, value in declared.items() if key not in forbidden}
        properties.update(dict.fromkeys(missing, extra))  # held to additionalProperties' schema
        return ObjectNode(properties, frozenset(required), extra,
                          {json_text(key): key for key in properties})

    def array(self, schema: dict) -> ArrayNode:
        low, high = count_bounds(schema, "minItems", "maxItems")
        prefix_schemas = schema.get("prefixItems", [])
        if not isinstance(prefix_schemas, list):
            raise SchemaError("prefixItems must be a list of schemas")
        # an item whose schema takes nothing cannot be there: the array ends before it
        ends = [i for i, s in enumerate(prefix_schemas) if self.nothing(s)]
        if ends or self.nothing(schema.get("items", True)):
            last = ends[0] if ends else len(prefix_schemas)
            high = last if high is None else min(high, last)
            if low > high:
                raise SchemaError(f"minItems ({low}) is above the {high} items that the schema "
                                  "false allows")
        prefix = tuple(self.node(s) for s in prefix_schemas[:high])
        items = self.node(schema.get("items", True)) if high is None or high > len(prefix) else self.any()
        return ArrayNode(items, low, high, prefix)

    def any(self) -> int:
        """Any JSON value; an object here takes any keys (it is the json_object format's)."""
        if self.any_node is None:
            self.any_node = index = self.reserve()
            options = (ObjectNode({}, frozenset(), index, {}), ArrayNode(index, 0, None), StringNode(),
                       NumberNode(integer=False), LiteralNode(("true", "false", "null")))
            self.nodes[index] = UnionNode(tuple(self.add(node) for node in options))
        return self.any_node


def _refuse_empty_cycles(nodes: tuple[Node, ...]) -> None:
    """A union that reaches itself through unions alone would read no character on its way."""
    finished: set[int] = set()

    def visit(index: int, path: set[int]) -> None:
        if index in finished or not isinstance(nodes[index], UnionNode):
            return
        if index in path:
            raise SchemaError("a $ref or anyOf cycle that reads no character (a schema that is "
                              "only itself)")
        path.add(index)
        for option in nodes[index].options:
            visit(option, path)
        path.discard(index)
        finished.add(index)

    for index in range(len(nodes)):
        visit(index, set())
