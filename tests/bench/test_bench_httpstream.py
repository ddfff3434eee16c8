"""The incremental HTTP/SSE parser against hand-written responses, split at every byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.bench.httpstream import ProtocolError, ResponseParser

EVENTS = [b'data: {"a": 1}', b'data: {"b": "x\\ny"}', b"data: [DONE]"]
SSE_BODY = b"".join(e + b"\n\n" for e in EVENTS)


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        piece = body[pos:pos + size]
        pos += size
        if piece:
            out += b"%x\r\n%s\r\n" % (len(piece), piece)
    if pos < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - pos, body[pos:])
    return out + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
RESPONSE = HEAD + chunked(SSE_BODY, [5, 17, 3, 40])


def feed_in_pieces(data: bytes, cuts: list[int]) -> ResponseParser:
    parser = ResponseParser()
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    done = False
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        assert not done, "the parser said done before the last byte"
        done = parser.feed(data[a:b], now_ns=i)
    assert done
    return parser


def test_chunked_sse_response_in_one_read():
    parser = feed_in_pieces(RESPONSE, [])
    assert parser.status == 200 and parser.keep_alive
    assert parser.events == EVENTS
    assert parser.event_ns == [0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_the_bytes_gives_the_same_events(cuts):
    parser = feed_in_pieces(RESPONSE, cuts)
    assert parser.events == EVENTS


def test_event_time_is_the_arrival_of_its_last_byte():
    parser = ResponseParser()
    first_event_end = RESPONSE.index(b"}\n\n") + 3
    parser.feed(RESPONSE[:first_event_end - 2], now_ns=100)  # the blank line is not here yet
    assert parser.events == []
    parser.feed(RESPONSE[first_event_end - 2:first_event_end], now_ns=200)
    parser.feed(RESPONSE[first_event_end:], now_ns=300)
    assert parser.event_ns == [200, 300, 300]


def test_crlf_delimited_events_and_content_length_body():
    body = b'data: {"a": 1}\r\n\r\ndata: [DONE]\r\n\r\n'
    data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    parser = feed_in_pieces(data, [len(data) - 20])  # cut between the CR and LF pairs
    assert parser.events == [b'data: {"a": 1}', b"data: [DONE]"]


def test_body_until_close_ends_only_on_eof():
    data = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2"
    parser = ResponseParser()
    assert not parser.feed(data, 5)
    assert not parser.keep_alive
    assert parser.feed_eof(9)
    assert parser.events == [b"data: 1", b"data: 2"]
    assert parser.event_ns == [5, 9]


def test_eof_inside_a_chunked_body_is_not_an_end():
    parser = ResponseParser()
    parser.feed(RESPONSE[:len(RESPONSE) - 10], 1)
    assert not parser.feed_eof(2)


def test_error_status_keeps_the_body_and_no_events():
    body = b'{"error": {"message": "boom"}}'
    data = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    parser = feed_in_pieces(data, [30])
    assert parser.status == 500 and parser.events == []
    assert parser.error_body() == body.decode()


def test_interim_100_continue_is_skipped():
    parser = feed_in_pieces(b"HTTP/1.1 100 Continue\r\n\r\n" + RESPONSE, [])
    assert parser.status == 200 and parser.events == EVENTS


def test_connection_close_header_disables_keep_alive():
    data = RESPONSE.replace(b"Transfer-Encoding", b"Connection: close\r\nTransfer-Encoding")
    assert not feed_in_pieces(data, []).keep_alive


@pytest.mark.parametrize("bad", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"SMTP ready\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
])
def test_malformed_responses_raise(bad):
    with pytest.raises(ProtocolError):
        ResponseParser().feed(bad, 0)
