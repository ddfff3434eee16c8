"""Backpressure: refuse new work (503 + Retry-After) while the engine's waiting queue is full.

A sequence counts as waiting only when the engine could not run it now. The rule:

    waiting = min(in_flight, max(in_flight - max_num_seqs, engine_waiting))

in_flight: the sequences (prompts x n) the server has admitted and not yet released, an exact
count; max_num_seqs: the most the engine runs in a step, so any beyond wait whatever else
happens; engine_waiting: those the scheduler held waiting at its last step (no KV blocks for
them, or the step's tokens spent on a long prompt), less those aborted since. That is the
engine's queue at its last step plus the sequences admitted since then that its free slots
cannot take: sequences it has not seen yet (a burst between two steps, a beam search between
two rounds) count as running while slots are free, and the queue past the slots never grows
beyond max_queued (one request may take the last places). Sequences the free slots would take
but the KV cache cannot are seen as waiting from the engine's next step on. The engine's count
may hold another server's sequences (several apps can share one engine): never more than
in_flight is counted.
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
        beyond_slots = self.in_flight - self.engine.max_num_seqs
        return min(self.in_flight, max(beyond_slots, self.engine.stats().scheduler.num_waiting))

    def try_admit(self, num_seqs: int) -> bool:
        """Admit unless the queue is already full (one request may take the last places)."""
        if self.num_waiting >= self.max_queued:
            return False
        self.in_flight += num_seqs
        return True

    def release(self, num_seqs: int) -> None:
        self.in_flight -= num_seqs
