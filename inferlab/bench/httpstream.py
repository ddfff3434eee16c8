"""Incremental HTTP/1.1 response parser that timestamps each server-sent event.

It sits on the timing path, so it does the least it can: split the status line and
headers, undo chunked transfer encoding, and cut the body into SSE event blocks,
stamping each with the arrival time of the bytes that completed it. The blocks are
parsed as JSON later, in another process (`inferlab.bench.events`).
"""

from __future__ import annotations

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)
MAX_HEAD_BYTES = 64 * 1024  # a longer status line + headers is a broken server
MAX_ERROR_BODY_BYTES = 16 * 1024  # enough of a non-200 body to show its message


class ProtocolError(Exception):
    """The server sent bytes that are not a valid HTTP/1.1 response."""


class ResponseParser:
    """Feed it the bytes of one response; it says when the response is complete."""

    __slots__ = (
        "state", "buf", "status", "reason", "headers", "keep_alive", "remaining",
        "body", "event_ns", "events", "headers_ns", "body_bytes",
    )

    def __init__(self) -> None:
        self.state = _HEAD
        self.buf = bytearray()  # raw bytes of an incomplete line or head, kept for the next read
        self.status: int | None = None
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.keep_alive = True  # HTTP/1.1 default; cleared by `Connection: close`
        self.remaining = 0  # bytes left in the current chunk or Content-Length body
        self.body = b""  # decoded body not yet cut into events (or the start of an error body)
        self.event_ns: list[int] = []  # arrival time of each SSE event block
        self.events: list[bytes] = []  # each SSE event block, without the blank line
        self.headers_ns: int | None = None  # when the status line and headers were complete
        self.body_bytes = 0  # decoded body bytes received in total

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def ok(self) -> bool:
        return self.status == 200

    def feed(self, data: bytes, now_ns: int) -> bool:
        """Consume `data` that arrived at `now_ns`; True once the response is complete."""
        if self.buf:
            data = bytes(self.buf) + data
            self.buf.clear()
        pos = 0
        # bytes after the end belong to no request: they stay in buf
        while self.state != _DONE:
            advanced = _STEPS[self.state](self, data, pos, now_ns)
            if advanced is None:  # the state needs more bytes than have come
                break
            pos = advanced
        if pos < len(data):
            self.buf += data[pos:]
        return self.state == _DONE

    # Each step consumes what its state can from data[pos:] and returns where it stopped, or
    # None when it needs more bytes to go on.

    def _head_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            if len(data) - pos > MAX_HEAD_BYTES:
                raise ProtocolError("response head longer than 64 KiB")
            return None
        self._head(data[pos:end], now_ns)
        return end + 4

    def _chunk_size_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        self._chunk_size(data[pos:end])
        return end + 2

    def _data_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        """A chunk's data or a Content-Length body."""
        if pos >= len(data):
            return None
        take = min(self.remaining, len(data) - pos)
        self._body(data[pos:pos + take], now_ns)
        self.remaining -= take
        if self.remaining == 0:
            if self.state == _CHUNK_DATA:
                self.state = _CHUNK_END
            else:
                self._finish(now_ns)
        return pos + take

    def _chunk_end_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        if len(data) - pos < 2:
            return None
        if data[pos:pos + 2] != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")
        self.state = _CHUNK_SIZE
        return pos + 2

    def _trailer_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        if end == pos:  # the blank line that ends the trailer
            self._finish(now_ns)
        return end + 2

    def _until_close_step(self, data: bytes, pos: int, now_ns: int) -> int | None:
        if pos >= len(data):
            return None
        self._body(data[pos:], now_ns)
        return len(data)

    def feed_eof(self, now_ns: int) -> bool:
        """The connection closed; True when that was a legitimate end of the body."""
        if self.state == _UNTIL_CLOSE:
            self._finish(now_ns)
        return self.state == _DONE

    def _finish(self, now_ns: int) -> None:
        if self.status == 200:
            self.body = self._split_events(self.body, now_ns, final=True)
        self.state = _DONE

    def _head(self, head: bytes, now_ns: int) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:  # an interim response (100 Continue); the real one follows
            return
        self.status, self.reason = status, parts[2] if len(parts) > 2 else ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            self.headers[name.strip().lower()] = value.strip()
        self.headers_ns = now_ns
        connection = self.headers.get("connection", "").lower()
        self.keep_alive = parts[0] != "HTTP/1.0" and "close" not in connection
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in self.headers:
            try:
                self.remaining = int(self.headers["content-length"])
            except ValueError:
                raise ProtocolError("bad Content-Length") from None
            self.state = _LENGTH
            if self.remaining == 0:
                self._finish(now_ns)
        elif status in (204, 304):
            self._finish(now_ns)
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False

    def _chunk_size(self, line: bytes) -> None:
        try:
            self.remaining = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {line[:20]!r}") from None
        self.state = _CHUNK_DATA if self.remaining else _TRAILER

    def _body(self, data: bytes, now_ns: int) -> None:
        self.body_bytes += len(data)
        if self.status != 200:  # an error body: keep its start for the message
            room = MAX_ERROR_BODY_BYTES - len(self.body)
            if room > 0:
                self.body += data[:room]
            return
        if self.body:
            data = self.body + data
        self.body = self._split_events(data, now_ns, final=False)

    def _split_events(self, data: bytes, now_ns: int, final: bool) -> bytes:
        """Record every complete event in `data`; return the incomplete rest."""
        if b"\r" in data:
            # hold back a trailing CR: its LF may come in the next read
            tail = b"\r" if data.endswith(b"\r") and not final else b""
            data = data[:len(data) - len(tail)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            data += tail
        start = 0
        while (end := data.find(b"\n\n", start)) >= 0:
            if end > start:
                self.events.append(data[start:end])
                self.event_ns.append(now_ns)
            start = end + 2
        rest = data[start:]
        if final and rest.strip():
            self.events.append(rest)
            self.event_ns.append(now_ns)
            rest = b""
        return rest

    def error_body(self) -> str:
        """The start of a non-200 body, for the error message."""
        return self.body.decode("utf-8", "replace")


_STEPS = {_HEAD: ResponseParser._head_step, _CHUNK_SIZE: ResponseParser._chunk_size_step,
          _CHUNK_DATA: ResponseParser._data_step, _LENGTH: ResponseParser._data_step,
          _CHUNK_END: ResponseParser._chunk_end_step, _TRAILER: ResponseParser._trailer_step,
          _UNTIL_CLOSE: ResponseParser._until_close_step}
