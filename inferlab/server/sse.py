"""Server-sent events: `data: {json}` blocks, `data: [DONE]` at the end, cleanup guaranteed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inferlab.server.errors import APIError, error_body

DONE = b"data: [DONE]\n\n"


def event(body: BaseModel) -> bytes:
    return b"data: " + body.model_dump_json().encode() + b"\n\n"


async def with_done(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The events, then [DONE]; a failure after the response started becomes an error event."""
    try:
        async for chunk in events:
            yield chunk
    except APIError as e:
        yield b"data: " + json.dumps(error_body(e.status, e.message, e.param, e.code)).encode() + b"\n\n"
    yield DONE


class EventStreamResponse(StreamingResponse):
    """A streamed response whose `on_close` runs however it ends, even if it never started.

    A generator's `finally` does not run if the client leaves before the first chunk is asked
    for, so the engine requests are released here instead.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(with_done(events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
