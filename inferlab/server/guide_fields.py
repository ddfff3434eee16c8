"""The structured-output fields of a request -> SamplingParams' guide fields: vLLM's guided_*
fields, its structured_outputs object and OpenAI's response_format, each guide given once."""

from __future__ import annotations

import json
import re
from typing import Any

from inferlab.server.errors import bad_request
from inferlab.server.protocol import SamplingFields


def guide_params(req: SamplingFields) -> dict[str, Any]:
    """SamplingParams' guide fields as the request sets them (None where it does not)."""
    _check_structured_outputs(req)
    return {"guided_choice": _guided("choice", req.guided_choice, req),
            "guided_regex": _guided("regex", req.guided_regex, req),
            "guided_grammar": _guided("grammar", req.guided_grammar, req), **_json_guide(req),
            "structural_tag": _structural_tag(req),
            "disable_any_whitespace": (req.structured_outputs or {}).get("disable_any_whitespace")}


def guide_field_names(req: SamplingFields) -> dict[str, str]:
    """Each guide's engine field -> the request field the client gave it by, so that a guide
    the engine refuses is named as sent (guided_json, response_format, structured_outputs.json)."""
    constraints, kind = req.structured_outputs or {}, (req.response_format or {}).get("type")
    given = {f"guided_{k}": f"guided_{k}" if getattr(req, f"guided_{k}") is not None
             else f"structured_outputs.{k}" if k in constraints else None
             for k in ("choice", "regex", "grammar")}
    given["json_schema"] = ("guided_json" if req.guided_json is not None
                            else "structured_outputs.json" if "json" in constraints
                            else "response_format" if kind == "json_schema" else None)
    given["json_object"] = ("response_format" if kind == "json_object"
                            else "structured_outputs.json_object" if "json_object" in constraints else None)
    given["structural_tag"] = ("response_format" if kind == "structural_tag"
                               else "structured_outputs.structural_tag" if "structural_tag" in constraints
                               else None)
    return {engine: sent for engine, sent in given.items() if sent}


STRUCTURED_OUTPUTS = ("choice", "regex", "json", "json_object", "grammar", "structural_tag",
                      "disable_any_whitespace")


def _check_structured_outputs(req: SamplingFields) -> None:
    """The structured outputs this server does not hold to (whitespace_pattern...) are refused by name."""
    others = sorted(set(req.structured_outputs or {}) - set(STRUCTURED_OUTPUTS))
    if others:
        raise bad_request(f"structured_outputs {', '.join(others)} is not supported by this server "
                          f"({', '.join(STRUCTURED_OUTPUTS[:-1])} and {STRUCTURED_OUTPUTS[-1]} are)",
                          "structured_outputs")


def _guided(kind: str, value: Any, req: SamplingFields) -> Any:
    """vLLM's guided_<kind> field, or structured_outputs {kind: ...}, given once."""
    constraints = req.structured_outputs or {}
    if value is not None and kind in constraints:
        raise bad_request(f"give the {kind} once: guided_{kind} or structured_outputs.{kind}",
                          f"guided_{kind}")
    return value if value is not None else constraints.get(kind)


def _json_guide(req: SamplingFields) -> dict[str, Any]:
    """SamplingParams' json_object and json_schema, from OpenAI's response_format (json_object,
    or json_schema with its schema), vLLM's structured_outputs ({"json_object": true} or
    {"json": schema}) or vLLM's guided_json. A schema is given once."""
    if req.response_format is not None and "type" not in req.response_format:
        raise bad_request("response_format needs a 'type' (text, json_object, json_schema or "
                          "structural_tag)", "response_format")
    response_format = req.response_format or {}
    kind = response_format.get("type", "text")
    if kind not in ("text", "json_object", "json_schema", "structural_tag"):
        raise bad_request(f"response_format type {kind!r} is not supported by this server "
                          "(text, json_object, json_schema and structural_tag are)", "response_format")
    constraints = req.structured_outputs or {}
    flag = constraints.get("json_object", False)
    if not isinstance(flag, bool):
        raise bad_request("structured_outputs.json_object must be true or false", "structured_outputs")
    schemas = {}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or spec.get("schema") is None:  # null once meant no guide
            raise bad_request("response_format json_schema needs {\"json_schema\": {\"name\": ..., "
                              "\"schema\": {...}}}", "response_format")
        _check_schema_header(spec)
        schemas["response_format"] = spec["schema"]
    if "json" in constraints:
        schemas["structured_outputs"] = _schema(constraints["json"], "structured_outputs")
    if req.guided_json is not None:
        schemas["guided_json"] = _schema(req.guided_json, "guided_json")
    if len(schemas) > 1:
        raise bad_request(f"give the JSON schema once, not in both {' and '.join(schemas)}",
                          next(iter(schemas)))
    return {"json_object": kind == "json_object" or flag,
            "json_schema": next(iter(schemas.values()), None)}


# OpenAI's rule for a response format's name
_SCHEMA_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _check_schema_header(spec: dict[str, Any]) -> None:
    """json_schema's name (required, OpenAI's characters) and strict (a boolean), as vLLM and
    OpenAI check them; the guide does not read them, so a typo would pass unnoticed."""
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise bad_request(f"response_format json_schema.name must be 1 to 64 letters, digits, '_' "
                          f"or '-', got {name!r}", "response_format")
    if not isinstance(spec.get("strict", False), bool | None):
        raise bad_request(f"response_format json_schema.strict must be true or false, got "
                          f"{spec['strict']!r}", "response_format")


def _structural_tag(req: SamplingFields) -> dict[str, Any] | None:
    """vLLM's structural tag: response_format {"type": "structural_tag", "structures": [...],
    "triggers": [...]}, or structured_outputs {"structural_tag": the same (or its JSON text)}."""
    response_format = req.response_format or {}
    given = {}
    if response_format.get("type") == "structural_tag":
        given["response_format"] = {k: v for k, v in response_format.items() if k != "type"}
    if "structural_tag" in (req.structured_outputs or {}):
        given["structured_outputs"] = _schema(req.structured_outputs["structural_tag"], "structured_outputs",
                                              "structural tag")
    if len(given) > 1:
        raise bad_request("give the structural tag once, not in both response_format and "
                          "structured_outputs", "response_format")
    return next(iter(given.values()), None)


def _schema(value: Any, field: str, what: str = "JSON schema") -> Any:
    """A schema (or structural tag), or its JSON text (vLLM takes both)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise bad_request(f"{field}: the {what}'s text is not JSON", field) from None
