"""A worker process: sends its share of a stage's requests on schedule, on one event loop.

The coordinator sends a `WorkerSetup`, then one `WorkerStage` at a time (or "stop" /
"exit"). The worker answers with `WorkerReport`s every `REPORT_INTERVAL_S` and a final
one when its share is done. Nothing is parsed here: exchanges go back raw.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from multiprocessing.connection import Connection

from inferlab.bench.client import ConnectionPool, RawExchange, Target, build_request, exchange
from inferlab.bench.client import now_ns as clock_ns
from inferlab.bench.config import NS_PER_S
from inferlab.bench.plans import WorkerReport, WorkerSetup, WorkerStage
from inferlab.bench.tags import request_tag

REPORT_INTERVAL_S = 0.1
STOP, EXIT, READY = "stop", "exit", "ready"


def worker_main(conn: Connection) -> None:
    """Process entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    setup: WorkerSetup = conn.recv()
    gc.freeze()  # the templates live for the whole run: keep them out of collections
    with contextlib.suppress(EOFError, BrokenPipeError):  # the coordinator went away
        asyncio.run(_Worker(conn, setup).serve())


async def _sleep_until(t_ns: int) -> None:
    delay_s = (t_ns - clock_ns()) / NS_PER_S
    if delay_s > 0:
        await asyncio.sleep(delay_s)


def _stream_index(plan: WorkerStage, n: int) -> int:
    """The stage-wide number of this worker's n-th request: its streams own one run of
    `streams` numbers in every `index_stride` (round n // streams), so no two workers share
    one and a request cap is dealt without gaps (pool._slot_share)."""
    return plan.index_base + n // plan.streams * plan.index_stride + n % plan.streams


class _Worker:
    def __init__(self, conn: Connection, setup: WorkerSetup) -> None:
        self.conn, self.setup = conn, setup
        self.target = Target.parse(setup.target_url)
        self.headers = dict(setup.headers)
        self.inbox: asyncio.Queue[object] = asyncio.Queue()
        self.stopping = False
        self.tasks: set[asyncio.Task[None]] = set()  # what a stop cancels
        self.finished: list[RawExchange] = []
        self.in_flight = 0
        self.sent = 0
        self.next_n = 0  # stream mode: requests this worker has taken in the stage

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.pool = ConnectionPool(self.target)
        loop.add_reader(self.conn.fileno(), self._on_message)
        self.conn.send(READY)  # imports done, loop running: stages can be timed from now
        try:
            while (message := await self.inbox.get()) != EXIT:
                if isinstance(message, WorkerStage):
                    await self._run_stage(message)
        finally:
            loop.remove_reader(self.conn.fileno())
            self.pool.close()

    def _on_message(self) -> None:
        try:
            while self.conn.poll():
                message = self.conn.recv()
                if message == STOP:
                    self._stop()
                else:
                    self.inbox.put_nowait(message)
        except (EOFError, OSError):
            self._stop()
            self.inbox.put_nowait(EXIT)

    def _stop(self) -> None:
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()

    async def _run_stage(self, plan: WorkerStage) -> None:
        loop = asyncio.get_running_loop()
        self.stopping, self.sent, self.in_flight = False, 0, 0
        reporter = loop.create_task(self._report_periodically(plan.stage))
        hard_stop = None
        if plan.hard_stop_ns is not None:
            hard_stop = loop.call_later(max(0.0, (plan.hard_stop_ns - clock_ns()) / NS_PER_S),
                                        self._stop)
        self.next_n = 0
        if plan.offsets_ns is not None:
            self._track(loop.create_task(self._issue_on_schedule(plan)))
        else:
            for s in range(plan.streams):
                self._track(loop.create_task(self._stream(plan, s)))
        while self.tasks:  # requests still in flight after the schedule ended
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if hard_stop is not None:
            hard_stop.cancel()
        reporter.cancel()
        self._report(plan.stage, done=True)

    def _track(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _issue_on_schedule(self, plan: WorkerStage) -> None:
        # 0 is a cap too (a worker with no part of --max-concurrency is dealt no sends)
        slots = None if plan.max_in_flight is None else asyncio.Semaphore(plan.max_in_flight)
        offsets = plan.offsets_ns or ()
        k = 0  # the next scheduled request
        try:
            while k < len(offsets):
                intended, index = plan.start_ns + offsets[k], plan.indices[k]
                await _sleep_until(intended)
                late = False
                if slots is not None:
                    # a send due before the stage's end goes when a slot is free, however
                    # late the timer woke; only one the cap held back past the end is dropped
                    held = slots.locked()
                    await slots.acquire()  # a full client delays the send; the lag is recorded
                    late = (held and plan.stop_issuing_ns is not None
                            and clock_ns() >= plan.stop_issuing_ns)
                if self.stopping or late:
                    break
                self._track(asyncio.get_running_loop().create_task(
                    self._one(plan, index, intended, slots)))
                k += 1
        except asyncio.CancelledError:
            pass
        self._never_sent(plan, offsets[k:], plan.indices[k:])

    def _never_sent(self, plan: WorkerStage, offsets: tuple[int, ...],
                    indices: tuple[int, ...]) -> None:
        """Scheduled requests the stage ended before sending, as cancelled: those due before
        it stopped issuing, or before now where it was stopped early (error limit, Ctrl-C)."""
        now = clock_ns()
        stop = now if plan.stop_issuing_ns is None else min(plan.stop_issuing_ns, now)
        for offset, index in zip(offsets, indices, strict=True):
            if plan.start_ns + offset < stop:
                self.finished.append(RawExchange(index, self._template_of(index),
                                                 plan.start_ns + offset, cancelled=True))

    async def _stream(self, plan: WorkerStage, s: int) -> None:
        stream_start = plan.start_ns
        if plan.ramp_up_ns and plan.total_streams:
            stream_start += (plan.stream_offset + s) * plan.ramp_up_ns // plan.total_streams
        await _sleep_until(stream_start)
        free_since = stream_start  # when this stream was last ready to send
        while not self.stopping:
            if plan.max_requests is not None and self.next_n >= plan.max_requests:
                return
            if plan.stop_issuing_ns is not None and clock_ns() >= plan.stop_issuing_ns:
                return
            n, self.next_n = self.next_n, self.next_n + 1
            intended = plan.start_ns if plan.queued_at_start else free_since
            free_since = await self._one(plan, _stream_index(plan, n), intended, None)

    async def _one(self, plan: WorkerStage, index: int, intended_ns: int,
                   slots: asyncio.Semaphore | None) -> int:
        """Run one request; returns when it ended."""
        template = self._template_of(index)
        body = self.setup.templates[template].body(
            request_tag(self.setup.nonce, plan.stage, index))
        request = build_request(self.target, self.setup.path, body, self.headers)
        record = RawExchange(index, template, intended_ns)
        self.sent += 1
        self.in_flight += 1
        try:
            await exchange(self.pool, request, record, plan.request_timeout_s)
        except asyncio.CancelledError:
            pass  # the record says cancelled; the stage is stopping
        finally:
            self.in_flight -= 1
            if slots is not None:
                slots.release()
            self.finished.append(record)
        return record.end_ns

    def _template_of(self, index: int) -> int:
        return index % len(self.setup.templates)

    async def _report_periodically(self, stage: int) -> None:
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            self._report(stage, done=False)

    def _report(self, stage: int, done: bool) -> None:
        batch, self.finished = self.finished, []
        self.conn.send(WorkerReport(self.setup.worker_id, stage, batch, self.in_flight,
                                    self.sent, done))
