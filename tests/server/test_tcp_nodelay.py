"""The server's connections send each write at once (TCP_NODELAY), as vLLM's uvicorn on uvloop
does: with Nagle's algorithm on, a kept-alive stream's first chunks waited for the client's
delayed ACK and arrived in one burst."""

from __future__ import annotations

import socket

from inferlab.server.listen import bind


def test_accepted_connections_have_nagle_off() -> None:
    listener = bind("127.0.0.1", 0)
    try:
        client = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        try:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            accepted.close()
            client.close()
    finally:
        listener.close()

