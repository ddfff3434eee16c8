"""Request bodies: read within a size limit, decode as JSON text, validate into a model.

Bodies are parsed here rather than by FastAPI so that every way a body can be wrong (too big,
not text, not JSON, not an object, a field of the wrong type) is a 400 or 413 with a message that
says which, never a 422 or a 500; a body that is not sent as JSON is a 415.
"""

from __future__ import annotations

import codecs
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from inferlab.server.disconnect import ClientDisconnected
from inferlab.server.errors import APIError, bad_request

ModelT = TypeVar("ModelT", bound=BaseModel)

# Past the limit a body is read on (and dropped) this far, so that the client, which sends its
# whole body before reading, gets the 413 rather than a reset connection.
_DRAIN_BYTES = 16 * 2**20
# pydantic's names for the member types of a union, which it puts in an error's location
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


async def read_json_body(request: Request, limit_bytes: int) -> dict[str, Any]:
    raw = await _read_limited(request, limit_bytes)  # first: a client sending a big body gets its 413
    _check_media_type(request)
    text = _decode(raw)
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e.msg} (line {e.lineno}, "
                          f"column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _decode(raw: bytes) -> str:
    """The body's text, read as json.loads(bytes) reads it (vLLM's Starlette request.json()
    calls it): UTF-8, UTF-16 or UTF-32 told apart by the first bytes (RFC 4627 section 3), a
    byte order mark skipped (RFC 8259 section 8.1 lets a parser ignore one). Unlike json.loads,
    a surrogate encoded as UTF-8 bytes is refused: those bytes are not UTF-8 (RFC 3629)."""
    encoding = json.detect_encoding(raw)
    start = len(codecs.BOM_UTF8) if encoding == "utf-8-sig" else 0
    try:
        return raw[start:].decode(encoding.removesuffix("-sig"))
    except UnicodeDecodeError as e:
        name = "UTF-" + encoding.split("-")[1]  # utf-16-le: UTF-16
        raise bad_request(f"the request body is not valid {name} "
                          f"(bad byte at offset {start + e.start})") from None


def _check_media_type(request: Request) -> None:
    """A body sent as something other than JSON (curl -d without a Content-Type sends a form) is
    refused as vLLM refuses it, rather than read as JSON regardless."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        sent = f"not {media}" if media else "and it came with no Content-Type"
        raise APIError(415, "the request body must be JSON sent with Content-Type: application/json, "
                            f"{sent}", code="unsupported_media_type")


async def _read_limited(request: Request, limit_bytes: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes + _DRAIN_BYTES:
        raise _too_large(int(declared), limit_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit_bytes + _DRAIN_BYTES:
                raise _too_large(size, limit_bytes)
            if size <= limit_bytes:
                chunks.append(chunk)
    except ClientDisconnect:  # gone before the whole body came: nobody to answer (499)
        raise ClientDisconnected() from None
    if size > limit_bytes:
        raise _too_large(size, limit_bytes)
    return b"".join(chunks)


def _too_large(size: int, limit_bytes: int) -> APIError:
    return APIError(413, f"the request body ({size} bytes or more) is over the limit of "
                         f"{limit_bytes} bytes", code="request_too_large")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(model: type[ModelT], body: dict[str, Any]) -> ModelT:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None


def _validation_error(error: ValidationError) -> APIError:
    errors = error.errors()
    first = errors[0]
    param = _param(first["loc"])
    if first["type"] == "missing":
        return bad_request(f"'{param}' is required", param)
    root = _union_root(first["loc"])
    if root is not None and sum(_union_root(e["loc"]) == root for e in errors) > 1:
        # a union field: every alternative failed (each at its own place: a list of token ids
        # at its bad item), so no single alternative's message fits; other fields' errors wait
        whole = [e["input"] for e in errors if _param(e["loc"]) == root and "input" in e]
        got = f" ({type(whole[0]).__name__})" if whole else ""
        return bad_request(f"'{root}' has the wrong type{got} or an invalid value", root)
    return bad_request(f"'{param}': {first['msg']}", param)


def _is_tag(part: int | str) -> bool:
    """A union alternative's name in an error's location (str, list[int]...)."""
    return isinstance(part, str) and (part.lower() in _UNION_TAGS or "[" in part)


def _param(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if not _is_tag(p))


def _union_root(loc: tuple[int | str, ...]) -> str | None:
    """The field whose union's alternative failed at loc (the path before its first tag)."""
    tags = [i for i, part in enumerate(loc) if _is_tag(part)]
    return _param(loc[:tags[0]]) if tags else None
