"""OpenAI fields this server does not implement: refused by name rather than silently ignored.

A field is refused only when its value would change the answer; a client library that sends the
neutral value (tools=[] on completions, best_of=1...) is served. A route whose request declares
one of these fields (chat declares tools) serves it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from inferlab.server.errors import bad_request


def _empty(value: Any, _: dict[str, Any]) -> bool:
    return value is None or value in ("", [], {})


def _always(_: Any, __: dict[str, Any]) -> bool:
    return True


# field -> is this value neutral (safe to ignore)?
_NEUTRAL: dict[str, Callable[[Any, dict[str, Any]], bool]] = {
    "tools": _empty,
    "tool_choice": lambda v, _: _empty(v, _) or v == "none",
    "parallel_tool_calls": _always,  # meaningless without tools
    "functions": _empty,  # the deprecated form of tools
    "function_call": lambda v, _: _empty(v, _) or v == "none",
    "suffix": _empty,
    "best_of": lambda v, body: v is None or v == _n(body),
    "audio": _empty,
    "modalities": lambda v, _: _empty(v, _) or v == ["text"],
    "prediction": _empty,
    # vLLM's own extensions this server does not implement, neutral at their defaults
    # vLLM's fast detokenizer only drops the space a joining decoder (WordPiece) puts between
    # added tokens; the byte-level and SentencePiece decoders this server loads put none
    "spaces_between_special_tokens": _always,
    "logits_processors": _empty,
    "chat_template": _empty,
    "documents": _empty,
    "mm_processor_kwargs": _empty,
    "vllm_xargs": _empty,
    "prompt_logprobs": lambda v, _: v is None,  # completions serves it; chat does not
    "guided_whitespace_pattern": _empty,  # as structured_outputs.whitespace_pattern is refused
    # vLLM's JSON text of a structural tag: response_format {"type": "structural_tag"} serves it
    "structural_tag": _empty,
}


# the type a field's value must have, served or not: a value of another type is the client's
# mistake, not a feature this server lacks
_TYPES: dict[str, tuple[type, str]] = {"spaces_between_special_tokens": (bool, "true or false"),
                                       "parallel_tool_calls": (bool, "true or false")}


def _n(body: dict[str, Any]) -> Any:
    return 1 if body.get("n") is None else body["n"]


def reject_unsupported(body: dict[str, Any], served: Collection[str] = ()) -> None:
    """served: the fields the route's request declares."""
    for name, (kind, words) in _TYPES.items():
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise bad_request(f"'{name}' must be {words}, got {body[name]!r}", name)
    best_of = body.get("best_of")
    if isinstance(best_of, bool):  # strict, as the request's own integers are (true is no 1)
        raise bad_request(f"'best_of' must be an integer, got {best_of!r}", "best_of")
    for name, neutral in _NEUTRAL.items():
        if name in body and name not in served and not neutral(body[name], body):
            raise bad_request(f"'{name}' is not supported by this server", name)
