"""Backpressure: refuse new work (503 + Retry-After) while the engine's waiting queue is full.

The engine's running count comes from a snapshot taken after each step, so the server keeps
its own exact count of the sequences it has handed to the engine; the difference is the
sequences still waiting to be scheduled. Between two steps a burst can only fill the queue,
never overshoot it: sequences the engine has not scheduled yet all count as waiting.
"""

from __future__ import annotations

from inferlab.engine.async_engine import AsyncEngine


class Admission:
    def __init__(self, engine: AsyncEngine, max_queued: int) -> None:
        self.engine = engine
        self.max_queued = max_queued
        self.in_flight = 0  # sequences (prompts x n) admitted and not yet released

    @property
    def num_waiting(self) -> int:
        running = min(self.engine.stats().num_running, self.in_flight)
        return self.in_flight - running

    def try_admit(self, num_seqs: int) -> bool:
        """Admit unless the queue is already full (one request may take the last places)."""
        if self.num_waiting >= self.max_queued:
            return False
        self.in_flight += num_seqs
        return True

    def release(self, num_seqs: int) -> None:
        self.in_flight -= num_seqs
