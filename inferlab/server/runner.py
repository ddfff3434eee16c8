"""Run the app under uvicorn: in the foreground with a graceful SIGTERM, or in a thread.

SIGTERM (or Ctrl-C): stop accepting connections, answer new requests on open ones with 503,
give in-flight requests `shutdown_timeout_s` to finish, then abort the rest (their streams end
with finish_reason "abort" and [DONE]; a request that had no token yet, streamed or not, and a
whole answer still to come, a beam search's, are a 503 with Retry-After instead) and stop the
engine.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from inferlab.engine.async_engine import AsyncEngine
from inferlab.server.app import create_app
from inferlab.server.context import ServerContext
from inferlab.server.listen import bind
from inferlab.server.settings import ServerSettings

logger = logging.getLogger("inferlab.server")

# uvicorn closes connections still open this long after the drain deadline
_CLOSE_MARGIN_S = 5.0


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_config(app: FastAPI, settings: ServerSettings) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                          timeout_keep_alive=settings.keep_alive_timeout_s,
                          timeout_graceful_shutdown=settings.shutdown_timeout_s + _CLOSE_MARGIN_S)


class _DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains the engine on SIGTERM/SIGINT and exits 0 afterwards."""

    def __init__(self, config: uvicorn.Config, ctx: ServerContext, loop: asyncio.AbstractEventLoop):
        super().__init__(config)
        self.ctx = ctx
        self.loop = loop
        self.drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's handler: it re-raises the signal after a clean shutdown, which would
        # turn a graceful drain into death by SIGTERM.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        self.loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self.force_exit:  # a second Ctrl-C, as in uvicorn and vLLM: no more waiting
            self.ctx.engine.cut_drain_short()
        if self.drain_task is None:
            self.ctx.start_draining()
            timeout = self.ctx.settings.shutdown_timeout_s
            logger.info("shutting down: in-flight requests get %.1f s", timeout)
            # the server's requests, not only the engine's: a beam search between two rounds,
            # or a prompt being encoded, holds no engine request and still gets its time
            admission = self.ctx.admission
            self.drain_task = self.loop.create_task(
                self.ctx.engine.shutdown(timeout, busy=lambda: admission.in_flight > 0))


async def serve(engine: AsyncEngine, settings: ServerSettings) -> None:
    """Serve until SIGTERM/SIGINT; prints the URL once it accepts connections."""
    app = create_app(engine, settings)
    sock = bind(settings.host, settings.port)
    server = _DrainingServer(_uvicorn_config(app, settings), app.state.inferlab,
                             asyncio.get_running_loop())
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        url = url_of(sock)
        print(f"inferlab: serving {', '.join(settings.model_names)} at {url} "
              f"(OpenAI API: {url}/v1)", flush=True)
    await task
    if server.drain_task is not None:
        await server.drain_task
    await engine.shutdown(timeout_s=0)
    print("inferlab: stopped", file=sys.stderr, flush=True)


class ServerThread:
    """The app on an ephemeral local port, in a background thread (tests)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1") -> None:
        self.sock = bind(host, 0)
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(_uvicorn_config(app, app.state.inferlab.settings))
        self.thread = threading.Thread(target=self._run, name="inferlab-server", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self, timeout_s: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError(f"the server at {self.url} did not start")
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
