"""A mock server in a child process, so it never shares an event loop with a client."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import signal
from multiprocessing.connection import Connection

from inferlab.bench.mock import MockConfig, MockServer
from inferlab.errors import InferlabError


def _process_main(conn: Connection, config: MockConfig) -> None:
    """Entry point of a mock server in its own process: sends its URL, runs until told."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    async def main() -> None:
        server = MockServer(config)
        try:
            conn.send(await server.start())
        except OSError as e:
            conn.send(OSError(e.errno, e.strerror))
            return
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(conn.fileno(), stop.set)  # a message, or EOF
        await stop.wait()
        await server.close()

    asyncio.run(main())


class MockProcess:
    """Starts on construction; `url` is where it listens. Use as a context manager."""

    def __init__(self, config: MockConfig) -> None:
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(target=_process_main, args=(child, config), daemon=True,
                                     name="bench-mock-server")
        self._proc.start()
        child.close()
        if not self._conn.poll(30):
            self.close()
            raise RuntimeError("the mock server did not start within 30 s")
        answer = self._conn.recv()
        if isinstance(answer, OSError):
            self.close()
            raise InferlabError(f"the mock server cannot listen on {config.host}:{config.port}: "
                                f"{answer.strerror}")
        self.url: str = answer

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already gone
            self._conn.send("exit")
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=2)
        self._conn.close()

    def __enter__(self) -> MockProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
