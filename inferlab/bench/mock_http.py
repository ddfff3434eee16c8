"""The mock server's HTTP/1.1 transport: requests read off a keep-alive connection, each
stamped with its arrival, and a stream's chunks written at their due times.

A connection hands each request to a handler (MockServer.handle), which answers it with writes
and says whether the connection may be reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

EMIT_BATCH = 64  # chunks a stream writes in one turn of the event loop at most


class Emitter:
    """Writes a stream's chunks at their due times from timer callbacks, not a sleeping
    coroutine: a token costs one write and no task switch. `finished` resolves to
    "done", "gone" (the client left) or "fail" (the drawn failure point was reached)."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop,
                 chunks: list[tuple[int, bytes]], dues: list[float], stop_at: int) -> None:
        self.conn, self.loop, self.chunks, self.dues = conn, loop, chunks, dues
        self.stop_at = stop_at  # tokens sent before failing (all of them: no failure)
        self.next = 0
        self.finished: asyncio.Future[str] = loop.create_future()
        loop.call_at(dues[0], self._emit)

    def _emit(self) -> None:
        """Write the chunks that are due, EMIT_BATCH at most, then set a timer for the next
        one: between batches the loop sees a client that left."""
        now, last = self.loop.time(), self.next + EMIT_BATCH
        while self.next < min(len(self.chunks), last) and self.dues[self.next] <= now:
            if self.conn.closed:
                self.finished.set_result("gone")
                return
            sent_after, data = self.chunks[self.next]
            if sent_after > self.stop_at:
                self.finished.set_result("fail")
                return
            self.conn.write(data)
            self.next += 1
        if self.next == len(self.chunks):
            self.finished.set_result("done")
        elif self.next == last:
            self.loop.call_soon(self._emit)
        else:
            self.loop.call_at(self.dues[self.next], self._emit)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    arrival: float  # loop.time() when its last byte was read: when its TTFT begins


class Connection(asyncio.Protocol):
    """Reads requests off one connection, stamping their arrival before any parsing."""

    def __init__(self, handle: Callable[[Request, Connection], Awaitable[bool]]) -> None:
        self.handle = handle
        self.buf = bytearray()
        self.pending: asyncio.Queue[Request | None] = asyncio.Queue()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        return self.lost.done()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        arrival = asyncio.get_running_loop().time()
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            try:
                method, path, headers = parse_head(bytes(self.buf[:end]))
                length = int(headers.get("content-length", "0"))
            except ValueError:
                self.abort()
                return
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            self.pending.put_nowait(Request(method, path, headers, body, arrival))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.pending.put_nowait(None)

    def write(self, data: bytes) -> None:
        # is_closing: a send already failed (the client left), which connection_lost says only
        # a turn later; a write now would log "socket.send() raised exception."
        if self.transport is not None and not self.closed and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    async def _serve(self) -> None:
        while (request := await self.pending.get()) is not None:
            keep_open = await self.handle(request, self)
            if not keep_open or "close" in request.headers.get("connection", "").lower():
                if self.transport is not None:
                    self.transport.close()
                return


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"bad header line {line!r}")
            headers[name.strip().lower()] = value.strip()
    return method, path, headers
