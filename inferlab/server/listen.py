"""The server's listening socket. Torch-free, so that `serve` finds its port taken before the
engine (and torch) loads."""

from __future__ import annotations

import socket

from inferlab.errors import InferlabError


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, with Nagle's algorithm off for the connections it accepts (Linux
    passes TCP_NODELAY on to them). asyncio sets it only on sockets made with proto
    IPPROTO_TCP, which create_server's are not: on a kept-alive connection, a stream's first
    chunks then waited for the client's delayed ACK, ~40 ms, and came in one burst."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as e:
        raise InferlabError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
