"""API request fields -> SamplingParams; its ValueErrors become 400s naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.errors import bad_request, parameter_error
from inferlab.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields


def completion_params(req: CompletionRequest, defaults: dict[str, Any]) -> SamplingParams:
    # the prompt's logprobs serve echo with logprobs and vLLM's prompt_logprobs: the larger top k
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    return _build(req, defaults, max_tokens=1 if echo_only(req) else req.max_tokens,
                  logprobs=req.logprobs, prompt_logprobs=max(asked) if asked else None)


def echo_only(req: CompletionRequest) -> bool:
    """OpenAI's max_tokens 0 with echo, how clients score a text's log-likelihood: the prompt
    and its logprobs come back and nothing else. The engine still samples one token (a request
    must), as vLLM's does, and the reply leaves it out."""
    return req.echo and req.max_tokens == 0


def chat_params(req: ChatCompletionRequest, defaults: dict[str, Any],
                tool_schema: dict[str, Any] | None = None,
                keep_special_tokens: bool = False) -> SamplingParams:
    """tool_schema: a forced tool call's guide; keep_special_tokens: the tool parser reads one."""
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    for_tools: dict[str, Any] = {} if tool_schema is None else {"json_schema": tool_schema}
    if keep_special_tokens:
        for_tools["skip_special_tokens"] = False
    # an error names the field the client set: top_logprobs is the engine's logprobs
    renamed = {"logprobs": "top_logprobs"}
    if tool_schema is not None:  # the forced tool call's guide
        renamed["json_schema"] = "tool_choice"
    if req.max_completion_tokens is not None:
        renamed["max_tokens"] = "max_completion_tokens"
    return _build(req, defaults, renamed, max_tokens=max_tokens, logprobs=logprobs, **for_tools)


def _build(req: SamplingFields, defaults: dict[str, Any], renamed: dict[str, str] | None = None,
           **fields: Any) -> SamplingParams:
    """defaults: the model's (generation_config.json) for the sampling fields a request leaves
    out; a max_tokens left out (None) is capped by the engine; renamed: for parameter_error."""
    # vLLM refuses any option given without stream, yet lets an empty {} by (falsy to its check)
    if req.stream_options is not None and req.stream_options.model_fields_set and not req.stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true", "stream_options")
    _check_structured_outputs(req)
    given = {
        "n": req.n, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "min_p": req.min_p, "seed": req.seed, "stop": req.stop, "stop_token_ids": req.stop_token_ids,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "ignore_eos": req.ignore_eos,
        "min_tokens": req.min_tokens, "logit_bias": _token_keys(req.logit_bias),
        "allowed_token_ids": req.allowed_token_ids, "truncate_prompt_tokens": req.truncate_prompt_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens, "bad_words": req.bad_words,
        "cache_salt": req.cache_salt, "guided_choice": _guided("choice", req.guided_choice, req),
        "guided_regex": _guided("regex", req.guided_regex, req),
        "guided_grammar": _guided("grammar", req.guided_grammar, req), **_json_guide(req),
        "structural_tag": _structural_tag(req),
        "disable_any_whitespace": (req.structured_outputs or {}).get("disable_any_whitespace"), **fields,
    }
    for name, value in defaults.items():
        if given.get(name) is None and name != "max_tokens":
            given[name] = value
    # None means "the default" everywhere except max_tokens, where it means "to the context end"
    kwargs = {k: v for k, v in given.items() if v is not None or k == "max_tokens"}
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:
        raise parameter_error(str(e), {**_guide_fields(req), **(renamed or {})}) from None


def _guide_fields(req: SamplingFields) -> dict[str, str]:
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


def _token_keys(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias keys are token ids written as JSON strings ("50256")."""
    if bias is None:
        return None
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
    return {int(key): value for key, value in bias.items()}


# what beam search does not hold to: set to anything but its default, it is refused by name
# (temperature is taken and has no effect, as in vLLM: beams rank by the model's own logprobs)
_NOT_FOR_BEAMS = ("seed", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
                  "bad_words", "min_tokens", "prompt_logprobs",
                  "guided_choice", "guided_json", "guided_regex", "guided_grammar",
                  "structured_outputs", "response_format", "include_stop_str_in_output")


def beam_search_params(req: SamplingFields, params: SamplingParams) -> BeamSearchParams | None:
    """vLLM's use_beam_search: the n best beams of params.max_tokens tokens; None without it."""
    if not req.use_beam_search:
        if req.length_penalty != 1.0:
            raise bad_request("'length_penalty' needs 'use_beam_search': true", "length_penalty")
        return None
    fields = type(req).model_fields
    for name in _NOT_FOR_BEAMS:
        value = getattr(req, name, None)
        if name in fields and value is not None and value != fields[name].default and value != {
                "type": "text"} and not (name == "seed" and value == -1):  # -1: no seed (vLLM)
            raise bad_request(f"beam search does not take '{name}'", name)
    if getattr(req, "echo", False) and params.prompt_logprobs is not None:  # vLLM asserts here
        raise bad_request("beam search does not take 'echo' with 'logprobs': the prompt's "
                          "logprobs are not computed", "echo")
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=params.max_tokens,
                                ignore_eos=params.ignore_eos, length_penalty=req.length_penalty,
                                logprobs=params.logprobs,
                                truncate_prompt_tokens=params.truncate_prompt_tokens,
                                cache_salt=params.cache_salt,
                                skip_special_tokens=params.skip_special_tokens)
    except ValueError as e:  # named as the request sets it: n is the beam width
        raise parameter_error(str(e), {"beam_width": "n"}) from None
