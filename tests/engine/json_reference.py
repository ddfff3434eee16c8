"""The reference the JSON grammar tests judge by: the jsonschema library, with the grammar's
documented stricter rules read in (json_schema.py lists them): no keys outside `properties`
unless `additionalProperties` is given, a declared key at most once, declared keys in the order
of `properties` and other keys after them, an integer without a fraction, an enum's number
spelled as json.dumps spells it, a bounded number without an exponent (and at most 15 digits if
it has a fraction)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from .grammar_fuzz import gaps_in_bounds


def _strict(schema: Any) -> Any:
    """The schema as the grammar reads it: objects without additionalProperties take no others."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k not in ("enum", "const") else v for k, v in schema.items()}
    if "properties" in schema or schema.get("type") == "object":
        out.setdefault("additionalProperties", False)
        out.setdefault("properties", {})  # so that the key order is checked (_properties_in_order)
    return out


def _declared(schema: Any) -> set[str]:
    """The keys the grammar takes at most once: those in properties, and the required ones."""
    if isinstance(schema, list):
        return set().union(*map(_declared, schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    names = set(schema.get("properties", {})) | set(schema.get("required", []))
    return names.union(*(_declared(v) for k, v in schema.items() if k not in ("enum", "const")))


class _SpelledInt(int):
    text: str


class _SpelledFloat(float):
    text: str


def _spelled(kind: type, text: str) -> Any:
    number = kind(text)
    number.text = text
    return number


def _enum_by_text(validator: Any, values: list, instance: Any, schema: dict) -> Any:
    """A number matches an enum's number only spelled as json.dumps spells it (the grammar's rule)."""
    if isinstance(instance, _SpelledInt | _SpelledFloat):
        if not any(json.dumps(v) == instance.text for v in values
                   if isinstance(v, int | float) and not isinstance(v, bool)):
            yield jsonschema.ValidationError(f"{instance.text} is not spelled as in the enum")
        return
    yield from jsonschema.Draft202012Validator.VALIDATORS["enum"](validator, values, instance, schema)


def _bounded_spelling(word: str) -> Any:
    """A bounded number is written without an exponent and, with a fraction, in at most 15
    digits past a leading 0 (the grammar's rule), then as jsonschema checks."""
    def check(validator: Any, bound: Any, instance: Any, schema: dict) -> Any:
        if isinstance(instance, _SpelledInt | _SpelledFloat):
            body = instance.text.lstrip("-").removeprefix("0")
            if "e" in body.lower() or "." in body and sum(c.isdigit() for c in body) > 15:
                yield jsonschema.ValidationError(f"{instance.text} is not spelled as a bounded number")
                return
        yield from jsonschema.Draft202012Validator.VALIDATORS[word](validator, bound, instance, schema)
    return check


def _properties_in_order(validator: Any, properties: dict, instance: Any, schema: dict) -> Any:
    """Declared keys come in the order of `properties`, then the required keys it does not
    declare in the order of `required`, other keys after them (the grammar's rule); then as
    jsonschema checks. The instance's dicts keep the text's key order."""
    if validator.is_type(instance, "object"):
        order = list(properties) + [k for k in schema.get("required", []) if k not in properties]
        places = [order.index(k) if k in order else len(order) for k in instance]
        if places != sorted(places):
            yield jsonschema.ValidationError(f"keys {list(instance)} are not in the schema's order")
    yield from jsonschema.Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, schema)


_INT_IS_INT = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
Reference = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_INT_IS_INT,
                                         validators={"enum": _enum_by_text,
                                                     "properties": _properties_in_order, **{
                                             w: _bounded_spelling(w) for w in ("minimum", "maximum",
                                                                               "exclusiveMinimum", "exclusiveMaximum")}})


def reference_accepts(schema: Any, text: str) -> bool:
    if not text or text != text.strip(" \t\n\r") or not gaps_in_bounds(text):
        return False
    declared = _declared(schema)

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in items]
        if any(keys.count(k) > 1 for k in set(keys) & declared):
            raise ValueError("a declared key twice")
        return dict(items)

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse, object_pairs_hook=pairs,
                           parse_int=lambda t: _spelled(_SpelledInt, t),
                           parse_float=lambda t: _spelled(_SpelledFloat, t))
    except (ValueError, RecursionError):
        return False
    return Reference(_strict(schema)).is_valid(value)
