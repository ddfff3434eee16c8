"""The steps every generation route shares: read the request, then answer whole or streamed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from inferlab.engine.outputs import RequestOutput
from inferlab.server.body import parse_body
from inferlab.server.context import ServerContext
from inferlab.server.disconnect import unless_disconnected
from inferlab.server.generation import Generation
from inferlab.server.protocol import SamplingFields
from inferlab.server.sse import EventStreamResponse
from inferlab.server.unsupported import reject_unsupported

RequestT = TypeVar("RequestT", bound=SamplingFields)
logger = logging.getLogger("inferlab.server")


async def read_request(request: Request, ctx: ServerContext, model: type[RequestT]) -> RequestT:
    body = await ctx.read_body(request)
    reject_unsupported(body, model.model_fields)
    req = parse_body(model, body)
    ignored = sorted(set(body) - set(model.model_fields))
    if ignored:  # a misspelt field (max_token) would otherwise pass unseen; vLLM logs them too
        logger.warning("fields present in the request but ignored: %s", ", ".join(ignored))
    ctx.check_model(req.model)
    return req


def asked_ids(req: SamplingFields, token_ids: Sequence[int] | None) -> list[int] | None:
    """Token ids for a response field, when the request's return_token_ids asks for them."""
    return list(token_ids) if req.return_token_ids and token_ids is not None else None


async def respond(request: Request, gen: Generation, stream: bool,
                  events: Callable[[], AsyncIterator[bytes]],
                  whole: Callable[[list[RequestOutput]], BaseModel]) -> Response:
    """Stream the events, or wait for every prompt to finish and send `whole(outputs)`."""
    if stream:
        return EventStreamResponse(events(), on_close=gen.close)
    try:
        finals = await unless_disconnected(request, gen.final_outputs())
    finally:
        await gen.close()
    return JSONResponse(whole(finals).model_dump())
