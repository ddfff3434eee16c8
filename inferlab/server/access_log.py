"""One log line per request: id, route, status, prompt and output tokens, TTFT, total time.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which would buffer streams and
hide disconnects): it logs when the app returns, which for a stream is after its last byte.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("inferlab.server.access")

CLIENT_GONE = 499  # nginx's status for "the client closed the connection first"
# a client's request id: visible ASCII (no space to split a log line), as long as Rails' limit
_REQUEST_ID = re.compile(r"[!-~]{1,255}")


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        request_id = _client_request_id(scope) or uuid.uuid4().hex[:16]
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status: list[int] = []

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _log(scope, state, status[0] if status else 500, started)


def _client_request_id(scope: Scope) -> str | None:
    """The client's X-Request-Id, which names the request as in vLLM (the reply's id is
    "cmpl-<it>" or "chatcmpl-<it>", the x-request-id header echoes it); None for one that would
    not fit a log line (too long, not visible ASCII): the request gets an id of its own."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _REQUEST_ID.fullmatch(text) else None
    return None


def _log(scope: Scope, state: dict, status: int, started: float) -> None:
    gen = state.get("generation")
    if gen is not None and gen.cut_short and status == 200:  # a stream the client left
        status = CLIENT_GONE
    fields = [f"id={state['request_id']}", f"{scope['method']} {scope['path']}", f"status={status}"]
    if gen is not None:
        fields += [f"prompt_tokens={gen.prompt_tokens}", f"output_tokens={gen.output_tokens}"]
        if gen.first_token_time is not None:
            fields.append(f"ttft_ms={(gen.first_token_time - started) * 1e3:.1f}")
    fields.append(f"total_ms={(time.monotonic() - started) * 1e3:.1f}")
    logger.info(" ".join(fields))
