"""The streaming client against real sockets: keep-alive, stale connections, failures."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading

import pytest

from inferlab.bench.client import (
    ConnectionPool,
    RawExchange,
    Target,
    build_request,
    exchange,
    now_ns,
)
from inferlab.errors import InferlabError

BODY = json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True,
                   "stream_options": {"include_usage": True}}).encode()


def run_exchanges(url: str, count: int, timeout_s: float = 10.0,
                  pause_s: float = 0.0) -> list[RawExchange]:
    async def main() -> list[RawExchange]:
        target = Target.parse(url)
        pool = ConnectionPool(target)
        request = build_request(target, "/v1/completions", BODY, {"X-Test": "1"})
        records = []
        for i in range(count):
            record = RawExchange(i, 0, now_ns())
            await exchange(pool, request, record, timeout_s)
            records.append(record)
            await asyncio.sleep(pause_s)
        pool.close()
        return records

    return asyncio.run(main())


def test_target_parsing():
    assert Target.parse("localhost:8000").url == "http://localhost:8000"
    assert Target.parse("https://api.example.com/proxy/").url == \
        "https://api.example.com:443/proxy"
    with pytest.raises(InferlabError):
        Target.parse("ftp://x")


def test_request_bytes():
    request = build_request(Target.parse("http://h:1/base"), "/v1/completions", b"{}",
                            {"Authorization": "Bearer k"})
    head, body = request.split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /base/v1/completions HTTP/1.1"
    assert b"Content-Length: 2" in head and b"Authorization: Bearer k" in head
    assert body == b"{}"


def test_stream_is_recorded_and_the_connection_reused(mock_server):
    records = run_exchanges(mock_server(), 3)
    assert [r.new_connection for r in records] == [True, False, False]
    for r in records:
        assert (r.status, r.error, r.cancelled) == (200, "", False)
        assert r.start_ns <= r.sent_ns <= r.headers_ns <= r.event_ns[0] <= r.end_ns
        assert r.events[-1] == b"data: [DONE]" and len(r.events) == 6  # 3 + finish + usage


class OneShotKeepAliveServer:
    """Answers the first request of each connection, then closes it on the next one
    without a reply: what a server whose idle timeout fired as the request came in does."""

    EVENTS = (b'data: {"choices": [{"text": "x", "finish_reason": "stop"}]}\n\n',
              b"data: [DONE]\n\n")
    RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n")

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(self.RESPONSE)
            conn.recv(65536)  # the next request on this connection: hang up on it

    def close(self) -> None:
        self.sock.close()


def test_a_connection_closed_by_the_server_is_retried_once():
    server = OneShotKeepAliveServer()
    try:
        first, second, third = run_exchanges(server.url, 3)
    finally:
        server.close()
    for r in (first, second, third):
        assert (r.status, r.error) == (200, ""), r.error
        assert r.new_connection  # each retry opened a fresh connection
    assert server.connections == 3


def test_connection_refused_is_an_error_not_a_crash():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (record,) = run_exchanges(f"http://127.0.0.1:{port}", 1)
    assert "ConnectionRefusedError" in record.error and record.status == 0


def test_timeout_on_a_hung_stream(mock_server):
    (record,) = run_exchanges(mock_server(hang_rate=1.0, itl_ms=1), 1, timeout_s=0.5)
    assert record.error == "timeout after 0.5 s"
    assert record.status == 200 and len(record.events) == 1  # one token, then silence
    assert 0.5e9 <= record.end_ns - record.start_ns < 5e9


def test_closed_mid_stream_is_an_error(mock_server):
    (record,) = run_exchanges(mock_server(close_rate=1.0), 1)
    assert "closed mid-response" in record.error and record.status == 200


class JsonAnswerServer(OneShotKeepAliveServer):
    """Answers a stream request with one whole JSON completion, as a server that ignores
    "stream": true would."""

    BODY = b'{"choices": [{"text": "x y z", "finish_reason": "length"}]}'
    RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


def one_exchange_with(server_class: type[OneShotKeepAliveServer]) -> RawExchange:
    server = server_class()
    try:
        (record,) = run_exchanges(server.url, 1)
    finally:
        server.close()
    return record


def test_a_200_that_is_not_an_event_stream_says_so():
    record = one_exchange_with(JsonAnswerServer)
    assert record.status == 200
    assert record.error == "the reply holds no server-sent event (Content-Type: application/json)"


class UntypedStreamServer(OneShotKeepAliveServer):
    """A stream whose Content-Type a proxy dropped: still events, read as such."""

    RESPONSE = OneShotKeepAliveServer.RESPONSE.replace(b"Content-Type: text/event-stream\r\n", b"")


def test_a_stream_without_its_content_type_is_still_read():
    record = one_exchange_with(UntypedStreamServer)
    assert (record.status, record.error) == (200, "")
    assert record.events[-1] == b"data: [DONE]"


def test_a_target_without_a_scheme_is_read_as_http_and_a_bad_one_refused():
    from inferlab.bench.config import TargetConfig

    assert TargetConfig("127.0.0.1:8000/v1").url == "http://127.0.0.1:8000"
    assert TargetConfig("http://[::1]:8000").url == "http://[::1]:8000"
    assert Target.parse("http://[::1]:8000").url == "http://[::1]:8000"  # as RFC 3986 writes it
    assert b"\r\nHost: [::1]:8000\r\n" in build_request(Target.parse("http://[::1]:8000"), "/x", b"", {})
    for url, message in (("ftp://h", "not an http:// or https:// URL with a host"),
                         ("http://", "not an http:// or https:// URL with a host"),
                         ("h:99999", "Port out of range 0-65535"),
                         ("http:/h:8000", "not an http:// or https:// URL with a host"),
                         ("http://h:0", "port 0 is no server's")):
        with pytest.raises(InferlabError, match=re.escape(f"bad --target {url!r}: {message}")):
            TargetConfig(url)
