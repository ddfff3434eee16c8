"""Stop waiting on the engine when the client goes away (before a response has started).

Once a streamed response has started, Starlette notices the disconnect itself and cancels the
stream; this covers the time before that: a non-streamed request, and a streamed one waiting
for its first token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection; there is nobody to answer."""


async def _until_disconnected(request: Request) -> None:
    # The body has been read, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientDisconnected."""
    return await unless(work, _until_disconnected(request), ClientDisconnected)


async def unless(work: Awaitable[T], stop: Awaitable[object], stopped: Callable[[], Exception]) -> T:
    """Await `work`; if `stop` completes first, cancel `work` and raise `stopped()`."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(stop)
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise stopped()
    finally:
        watch.cancel()
        task.cancel()
