"""Streaming HTTP/1.1 client on asyncio sockets, built to timestamp server-sent events.

Why not httpx: every byte that arrives is stamped with `time.monotonic_ns()` inside
`data_received`, before any parsing, and nothing else (JSON, decoding, statistics)
runs on this path. Connections are kept alive and reused, like a real API client.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from inferlab.bench.config import url_host
from inferlab.bench.httpstream import ProtocolError, ResponseParser
from inferlab.errors import InferlabError

now_ns = time.monotonic_ns  # CLOCK_MONOTONIC: one clock shared by every process on the machine
TIMEOUT_ERROR = "timeout after"  # how a request cut by --request-timeout fails


@dataclass(frozen=True)
class Target:
    """Where requests go: scheme, host, port and the base path before /v1/..."""

    scheme: str
    host: str
    port: int
    base_path: str

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise InferlabError(f"target must be an http:// or https:// URL, got {self.scheme}://")

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if not parts.hostname:
            raise InferlabError(f"cannot read a host in target URL {url!r}")
        default_port = 443 if parts.scheme == "https" else 80
        return cls(parts.scheme, parts.hostname, parts.port or default_port,
                   parts.path.rstrip("/"))

    @property
    def url(self) -> str:
        return f"{self.scheme}://{url_host(self.host)}:{self.port}{self.base_path}"


@dataclass(slots=True)
class RawExchange:
    """One request as the worker saw it: times and raw event blocks, nothing parsed."""

    index: int  # request number within the stage, unique across workers
    template: int  # which prompt template it used
    intended_ns: int  # when the schedule wanted it sent
    start_ns: int = 0  # when the client began it (slot taken, before connecting)
    # sent_ns and headers_ns stay here, not in the report (its times count from start_ns): they
    # split a slow request's time into connecting, sending and the server's wait when debugging
    # the client, and let its tests check the phases come in order
    sent_ns: int = 0  # when its bytes were handed to the socket; 0: never sent
    headers_ns: int = 0  # when the response status line and headers arrived
    end_ns: int = 0  # when the response ended, failed or was cancelled
    status: int = 0  # HTTP status; 0: no response
    error: str = ""  # transport failure: refused, reset, timeout, incomplete stream
    cancelled: bool = False  # stopped by the benchmark (stage end, error limit, Ctrl-C)
    new_connection: bool = False  # a fresh TCP connection was opened for it
    event_ns: list[int] = field(default_factory=list)  # arrival time of each SSE event
    events: list[bytes] = field(default_factory=list)  # raw SSE event blocks
    error_body: str = ""  # start of a non-200 body


class _Connection(asyncio.Protocol):
    """One keep-alive TCP connection; carries one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.received_any = False  # whether the current request got a byte back

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        stamp = now_ns()
        parser = self.parser
        if parser is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        self.received_any = True
        try:
            done = parser.feed(data, stamp)
        except ProtocolError as e:
            self._finish(e)
            self.abort()
            return
        if done:
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None:
            if self.parser.feed_eof(now_ns()):
                self._finish(None)
            else:
                reason = f": {exc}" if exc else ""
                self._finish(ConnectionError(f"connection closed mid-response{reason}"))

    def begin(self, parser: ResponseParser, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise ConnectionError("connection already closed")
        self.parser, self.received_any = parser, False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def _finish(self, exc: Exception | None) -> None:
        waiter, self.waiter, self.parser = self.waiter, None, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class ConnectionPool:
    """Idle keep-alive connections to one target, opened on demand."""

    def __init__(self, target: Target, connect_timeout_s: float = 10.0) -> None:
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[_Connection] = []
        self.ssl_context = ssl.create_default_context() if target.scheme == "https" else None

    async def open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        coro = loop.create_connection(_Connection, self.target.host, self.target.port,
                                      ssl=self.ssl_context)
        try:
            _, conn = await asyncio.wait_for(coro, self.connect_timeout_s)
        except TimeoutError:
            raise ConnectionError(f"no connection within {self.connect_timeout_s:g} s") from None
        return conn

    def take_idle(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    def release(self, conn: _Connection, reusable: bool) -> None:
        if reusable and not conn.closed:
            self.idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        for conn in self.idle:
            conn.abort()
        self.idle.clear()


async def exchange(pool: ConnectionPool, request: bytes, record: RawExchange,
                   timeout_s: float) -> None:
    """Send one request and fill `record`; never raises except on cancellation."""
    record.start_ns = now_ns()
    deadline_s = time.monotonic() + timeout_s
    conn: _Connection | None = None
    parser = ResponseParser()
    try:
        for attempt in range(2):
            conn = pool.take_idle() if attempt == 0 else None
            if conn is None:
                record.new_connection = True
                conn = await pool.open()
            parser = ResponseParser()
            try:
                waiter = conn.begin(parser, request)
                record.sent_ns = now_ns()
                await asyncio.wait_for(waiter, max(0.0, deadline_s - time.monotonic()))
                break
            except ConnectionError:
                # a kept-alive connection the server had closed: retry once on a new one
                if record.new_connection or conn.received_any:
                    raise
        _fill(record, parser)
        pool.release(conn, parser.keep_alive)
    except asyncio.CancelledError:
        _fill(record, parser)
        record.cancelled = True
        if conn is not None:
            conn.abort()
        raise
    except TimeoutError:
        _fill(record, parser)
        record.error = f"{TIMEOUT_ERROR} {timeout_s:g} s"
        if conn is not None:
            conn.abort()
    except (OSError, ProtocolError) as e:
        _fill(record, parser)
        record.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if conn is not None:
            conn.abort()
    finally:
        record.end_ns = now_ns()


def _fill(record: RawExchange, parser: ResponseParser) -> None:
    record.status = parser.status or 0
    record.headers_ns = parser.headers_ns or 0
    record.event_ns = parser.event_ns
    record.events = parser.events
    if parser.status is not None and parser.status != 200:
        record.error_body = parser.error_body()
    if parser.status == 200 and parser.done and not any(map(_has_data, parser.events)):
        # every request asks for a stream; a whole JSON answer has no token times to take. By
        # the body, not the Content-Type, which a proxy may drop or rewrite
        content_type = parser.headers.get("content-type") or "none"
        record.error = f"the reply holds no server-sent event (Content-Type: {content_type})"


def _has_data(event: bytes) -> bool:
    return any(line.startswith(b"data:") for line in event.split(b"\n"))


def build_request(target: Target, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one POST, ready to write; built before the timing path."""
    lines = [
        f"POST {target.base_path}{path} HTTP/1.1",
        f"Host: {url_host(target.host)}:{target.port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
