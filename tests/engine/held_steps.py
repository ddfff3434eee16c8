"""An AsyncEngine whose steps are held one at a time, so that a test acts while a step is
under way (an add or an abort posted then runs when that step ends)."""

from __future__ import annotations

import asyncio
import threading

from inferlab.engine.async_engine import AsyncEngine


class HeldSteps:
    """Holds each of the engine's steps until let go; `held` is set while one is held."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.held = threading.Event()
        self._permits = threading.Semaphore(0)
        self._holding = True
        self._step = engine.engine.step
        engine.engine.step = self._held_step

    def _held_step(self, *args, **kwargs):
        if self._holding:
            self.held.set()
            self._permits.acquire(timeout=10)
        return self._step(*args, **kwargs)

    async def wait_held(self) -> None:
        assert await asyncio.to_thread(self.held.wait, 10), "no step was held"

    async def next_step(self) -> None:
        """Let the held step end and wait until the next one is held: the stats are those
        of the step let go, and the operations posted meanwhile have run."""
        self.held.clear()
        self._permits.release()
        await self.wait_held()

    def let_go(self) -> None:
        """Let the held step end and hold none from here on."""
        self._holding = False
        self._permits.release()

    async def close(self) -> None:
        self.let_go()
        await self.engine.shutdown(0)


async def posted(engine: AsyncEngine, timeout_s: float = 60.0) -> None:
    """Wait until an operation (an add, an abort) is posted to the engine thread."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while engine._ops.empty():
        assert asyncio.get_running_loop().time() < deadline, "nothing was posted"
        await asyncio.sleep(0.01)
