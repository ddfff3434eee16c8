"""The JSON Schema keywords the grammar reads, by what they constrain, and those it reads past."""

from __future__ import annotations

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
                         "discriminator"})
OBJECT_WORDS = frozenset({"properties", "required", "additionalProperties"})
ARRAY_WORDS = frozenset({"items", "prefixItems", "minItems", "maxItems"})
STRING_WORDS = frozenset({"pattern", "format", "minLength", "maxLength"})
BOUND_WORDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
NUMBER_WORDS = frozenset(BOUND_WORDS)
TYPE_WORDS = OBJECT_WORDS | ARRAY_WORDS | STRING_WORDS | NUMBER_WORDS | {"type"}
SUPPORTED = TYPE_WORDS | {"enum", "const", "anyOf", "oneOf", "allOf", "$ref"}
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# keywords the grammar does not hold to, at the value that constrains nothing (read as absent)
NEUTRAL = {"uniqueItems": False, "minProperties": 0}
