"""Every error leaves the server as OpenAI error JSON: {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferlab.errors import ContextLengthError, InferlabError, PromptError

logger = logging.getLogger("inferlab.server")

# status -> the OpenAI error type clients switch on (a 404's is invalid_request_error too: OpenAI's
# unknown model is {"type": "invalid_request_error", "code": "model_not_found"})
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          503: "service_unavailable"}


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code),
                        status_code=error.status, headers=error.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def prompt_error(error: PromptError, path: str) -> APIError:
    """A 400 that names the field holding the prompt on this route, with OpenAI's code for a
    prompt too long for the context ({"param": "messages", "code": "context_length_exceeded"})."""
    field = "messages" if path.endswith("/chat/completions") else "prompt"
    code = "context_length_exceeded" if isinstance(error, ContextLengthError) else "invalid_value"
    return APIError(400, str(error), param=field, code=code)


def parameter_error(message: str, renamed: Mapping[str, str] | None = None) -> APIError:
    """A 400 for an InvalidParameterError, whose messages start with the field's name
    ("top_p must be in (0, 1], got 2", "json_schema: ...") or two of them ("guided_choice and
    json_schema cannot be combined"). renamed: an internal field -> the request field the client
    set it by (chat's top_logprobs is the engine's logprobs; "structured_outputs.regex": the
    param is the part before the dot); only those leading names are renamed, never the client's
    own values quoted after them."""
    names = re.match(r"(\w+)(?: and (\w+)(?= cannot be combined))?", message)
    if renamed and names:
        first, second = (renamed.get(n, n) if n else None for n in names.groups())
        message = first + (f" and {second}" if second else "") + message[names.end():]
    field = message.split(" ", 1)[0].removesuffix(":").split(".")[0]
    return bad_request(message, field if field.isidentifier() else None)


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    """retry_after_s: the Retry-After of every 503 (busy, shutting down, the engine gone), so
    that a client or balancer retries it, here later or on another replica."""
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        if exc.status == 503:
            exc.headers.setdefault("Retry-After", str(retry_after_s))
        return error_response(exc)

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        return error_response(APIError(exc.status_code, message, headers=dict(exc.headers or {})))

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(bad_request(f"invalid request: {exc.errors()[0]['msg']}"))

    async def on_user_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, PromptError):
            return error_response(prompt_error(exc, request.url.path))
        return error_response(bad_request(str(exc)))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return error_response(APIError(500, f"internal server error: {type(exc).__name__}"))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(InferlabError, on_user_error)
    app.add_exception_handler(Exception, on_unexpected)
