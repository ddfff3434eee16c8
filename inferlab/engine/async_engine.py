"""AsyncEngine: the engine loop in its own thread, driven from many asyncio coroutines.

Coroutines never touch the engine directly: they post operations (add, abort) to a queue that
the engine thread drains before each step, and receive outputs through per-request asyncio
queues, so the event loop never waits for a forward pass.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from inferlab.config import EngineConfig
from inferlab.engine.beam_driver import Observer, run_rounds
from inferlab.engine.beam_search import BeamSearch, BeamSearchParams
from inferlab.engine.engine_counters import EngineStats
from inferlab.engine.llm_engine import LLMEngine
from inferlab.engine.outputs import RequestOutput
from inferlab.engine.prompt_input import PromptType, read_prompt
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import GuidedDecodingError, InferlabError
from inferlab.kernels import cpu_ops

logger = logging.getLogger("inferlab.engine")

_IDLE_WAIT_S = 0.2  # how often an idle loop wakes to refresh its heartbeat
_Sink = Callable[[RequestOutput | BaseException], None]


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an internal error; requests fail at once until a restart."""


class EngineStepError(EngineDeadError):
    """What a request the engine was running when it died gets: the failure was in its steps."""


class EngineShuttingDownError(InferlabError):
    """Work the engine can no longer take or finish: it is stopping (a server answers 503)."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = engine.loaded.path
        # they read the tokenizer and the limits only: callable from any thread
        self.tokenize_prompt = engine.tokenize_prompt
        self.check_text_fits = engine.check_text_fits
        self.max_model_len = engine.max_model_len
        self.max_num_seqs = engine.config.max_num_seqs  # the most sequences a step runs
        self.sampling_defaults = engine.generation.sampling  # the model's, for what requests leave out
        self._ops: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._drain_deadline = math.inf  # monotonic time the shutdown under way waits until
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, _Sink]] = {}
        self._wake = threading.Event()
        self._closing = threading.Event()  # shutdown's abort phase: adds are refused from then on
        self._stop = threading.Event()
        self._closed = False  # the thread has ended: calls fail at once (under _pending_lock)
        self._stats = self._snapshot()
        # requests added since the last step: its snapshot did not count them waiting (engine thread)
        self._unstepped: set[str] = set()
        self.heartbeat = time.monotonic()  # last time the loop went round; /health reads it
        self.error: BaseException | None = None
        # futures of _call whose operation has not run yet, failed if the loop dies first
        self._pending: dict[asyncio.Future, asyncio.AbstractEventLoop] = {}
        self._pending_lock = threading.Lock()
        self._step_observers: list[weakref.WeakMethod] = []  # added from other threads
        self._observers_lock = threading.Lock()
        if engine.device.type == "cpu":  # from here on, kernels run on the engine thread only
            cpu_ops.release_openmp_threads()
        self._thread = threading.Thread(target=self._loop, name="inferlab-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine(config))

    # -- called from coroutines ---------------------------------------------------------------

    async def generate(self, prompt: PromptType, params: SamplingParams,
                       request_id: str, priority: int = 0,
                       on_output: Observer | None = None) -> AsyncIterator[RequestOutput]:
        """Stream outputs; closing the iterator early (client gone) aborts the request.
        on_output gets each output as it arrives, whether or not the iterator reads it."""
        outputs: asyncio.Queue = asyncio.Queue()

        def sink(item: RequestOutput | BaseException) -> None:
            outputs.put_nowait(item)  # first: an on_output that raises loses the reader nothing
            if on_output is not None and isinstance(item, RequestOutput):
                on_output(item)

        finished = False
        prompt = read_prompt(prompt)  # vLLM's prompt dicts too, as LLM.generate takes them
        try:
            # inside the try: a caller cancelled while the add is queued still aborts it
            await self.submit(prompt, params, request_id, sink, priority)
            while not finished:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        except InferlabError:
            finished = True  # refused at add: nothing to abort
            raise
        finally:
            if not finished:
                self._post(lambda: self._abort(request_id, sink))

    async def start_beam_search(self, prompt: str | Sequence[int],
                                params: BeamSearchParams) -> tuple[str | None, BeamSearch]:
        """(the prompt's text, its search), the prompt checked and encoded off this loop; raises
        what a prompt the search cannot take raises, before any engine request exists."""
        return await asyncio.to_thread(self.engine.start_beam_search, prompt, params)

    async def beam_search(self, text: str | None, search: BeamSearch, request_id: str,
                          priority: int = 0, on_output: Observer | None = None) -> RequestOutput:
        """The best beams of a search start_beam_search began, as one finished output; its
        rounds run as beam_driver.run_rounds says, each output of their requests handed to
        on_output as it arrives. Cancelling aborts the round's requests."""
        if not await run_rounds(self, search, request_id, priority, on_output):
            raise _shutting_down()
        return search.output(request_id, self.tokenizer, text, self.engine.outputs.decoded_tokens)

    async def submit(self, prompt: str | Sequence[int], params: SamplingParams, request_id: str,
                     sink: _Sink, priority: int = 0) -> None:
        """Add a request whose outputs are handed to `sink` on this event loop, without a task
        or queue of its own between (one hop less a token; the server's submit_all is the same
        for n prompts); the last output
        is finished, and an engine failure arrives as an exception. Raises what add_request
        raises; the caller aborts the request if it stops reading early."""
        await self.submit_all([(request_id, prompt, sink)], params, priority)

    async def submit_all(self, requests: Sequence[tuple[str, str | Sequence[int], _Sink]],
                         params: SamplingParams, priority: int = 0) -> list[list[int]]:
        """submit() for each (request id, prompt, sink), all or none: every prompt is encoded
        and checked before any request is added, so one refused prompt leaves no request of
        the others running nor counted. Returns each prompt's token ids as its requests run
        them (truncate_prompt_tokens cut)."""
        # here, before encoding, as vLLM's frontend: on the engine thread TTFT missed the step's wait
        arrival = time.monotonic()
        if self._closing.is_set():
            raise _shutting_down()
        if self.error is not None:
            raise self._dead()
        loop = asyncio.get_running_loop()
        # off the engine thread, and off this loop's: encoding lets go of the GIL, so the loop
        # goes on streaming other requests while a long prompt is encoded
        truncating = params.truncate_prompt_tokens is not None
        encoded = await asyncio.gather(*(
            asyncio.to_thread(self.engine.tokenize_prompt, prompt, truncating)
            for _, prompt, _ in requests))
        batch = [(request_id, ids, prompt if isinstance(prompt, str) else None)
                 for (request_id, prompt, _), (_, ids) in zip(requests, encoded, strict=True)]
        sinks = [sink for _, _, sink in requests]
        return await self._call(lambda: self._add(batch, sinks, params, loop, priority, arrival))

    async def abort(self, request_id: str) -> None:
        self._post(lambda: self._abort(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def observe_steps(self, method: Callable[[float, int], None]) -> None:
        """Call the bound `method(seconds, tokens)` after every step, on the engine thread
        (keep it short); held weakly, so the observer goes away with its object."""
        with self._observers_lock:
            self._step_observers.append(weakref.WeakMethod(method))

    def is_healthy(self, max_silence_s: float = 5.0) -> bool:
        return (self.error is None and self._thread.is_alive()
                and time.monotonic() - self.heartbeat < max_silence_s)

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    async def shutdown(self, timeout_s: float = 30.0,
                       busy: Callable[[], bool] = lambda: False) -> None:
        """Let in-flight requests finish for up to timeout_s (or until cut_drain_short), abort
        the rest, stop the thread. busy: whether the caller still has work under way that may
        hold no request now (a server's: a beam search between two rounds, a prompt being
        encoded), which gets the same time."""
        self._drain_deadline = min(self._drain_deadline, time.monotonic() + timeout_s)
        while ((self._streams or busy()) and self._thread.is_alive()
               and time.monotonic() < self._drain_deadline):
            await asyncio.sleep(0.05)
        # before the streams are listed: an add still on its way (a prompt being encoded, or
        # queued for this thread) is refused when it runs, not left streaming past the stop
        self._closing.set()
        for request_id in list(self._streams):
            self._post(lambda rid=request_id: self._abort(rid))
        await asyncio.to_thread(self._drain_and_stop)

    def cut_drain_short(self) -> None:
        """A second Ctrl-C: the shutdown under way (or about to start) aborts what runs now."""
        self._drain_deadline = -math.inf

    # -- the engine thread ----------------------------------------------------------------------

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread and return its result (or raise its error) here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._pending_lock:
            if self.error is not None:
                raise self._dead()
            if self._closed:
                raise _shutting_down()
            self._pending[future] = loop

        def run() -> None:
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, which decides
                _send(loop, _settle, future, None, e)
            else:
                _send(loop, _settle, future, result, None)

        self._post(run)
        try:
            return await future
        finally:
            with self._pending_lock:
                self._pending.pop(future, None)

    def _dead(self) -> EngineDeadError:
        return EngineDeadError(f"the engine stopped after an internal error ({self.error!r}); "
                               "restart the server")

    def _post(self, fn: Callable[[], None]) -> None:
        self._ops.put(fn)
        self._wake.set()

    def _add(self, batch: list[tuple[str, list[int], str | None]], sinks: list[_Sink],
             params: SamplingParams, loop: asyncio.AbstractEventLoop,
             priority: int, arrival: float) -> list[list[int]]:
        if self._closing.is_set():
            raise _shutting_down()
        prompt_ids = self.engine.add_requests(batch, params, arrival, priority)
        self._unstepped.update(request_id for request_id, _, _ in batch)
        for (request_id, _, _), sink in zip(batch, sinks, strict=True):
            self._streams[request_id] = (loop, sink)
        return prompt_ids

    def _abort(self, request_id: str, sink: _Sink | None = None) -> None:
        """With `sink`, only if the request streams to it: a generate() cancelled before its add
        came back (one refused for a request id in use) must not abort the id's holder."""
        stream = self._streams.get(request_id)
        if sink is not None and (stream is None or stream[1] is not sink):
            return
        waiting_before = self.engine.scheduler.num_waiting
        output = self.engine.abort_request(request_id)
        self._show_abort(request_id, waiting_before - self.engine.scheduler.num_waiting)
        stream = self._streams.pop(request_id, None)
        if stream is not None and output is not None:
            _send(stream[0], stream[1], output)

    def _show_abort(self, request_id: str, num_unqueued: int) -> None:
        """Snapshot the stats again: backpressure reads the waiting count, which would count
        an aborted queued request until the next step ended. The count is the last step's less
        the num_unqueued sequences the abort took off the queue (none if the request came after
        that step), not the scheduler's count now: that one holds every request added since the
        step, which free slots may well run at the next, and backpressure would refuse a burst
        for them."""
        if request_id in self._unstepped:
            self._unstepped.discard(request_id)
            num_unqueued = 0
        self._stats = self._snapshot(self._stats.scheduler.num_waiting - num_unqueued)

    def _loop(self) -> None:
        self.engine.bind_threads()
        try:
            while not self._stop.is_set():
                self.heartbeat = time.monotonic()
                while not self._ops.empty():
                    self._ops.get()()
                outputs = []
                if self.engine.has_unfinished_requests():
                    started = time.perf_counter()
                    outputs = self.engine.step()
                    self._observe_step(time.perf_counter() - started)
                else:
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                # before the outputs go out: a scrape after a reply finds the reply counted
                self._unstepped.clear()
                self._stats = self._snapshot()
                self._deliver(outputs)
        except BaseException as e:  # a bug: fail every stream and queued call, never hang them
            logger.exception("engine loop died")
            self.error = e
        self._fail_waiters()

    def _fail_waiters(self) -> None:
        """The thread is ending: every call not run and every stream left gets the reason (the
        engine's death, or the shutdown), and later calls fail at once."""
        dead = self.error is not None
        with self._pending_lock:
            self._closed = True
            pending = list(self._pending.items())
        for future, loop in pending:
            _send(loop, _settle, future, None, self._dead() if dead else _shutting_down())
        streams, self._streams = list(self._streams.values()), {}
        for loop, sink in streams:
            _send(loop, sink, EngineStepError(f"the engine failed while running this request "
                                              f"({self.error!r}); restart the server")
                  if dead else _shutting_down())

    def _observe_step(self, seconds: float) -> None:
        with self._observers_lock:
            live = [ref() for ref in self._step_observers]
            self._step_observers = [ref for ref, method in zip(self._step_observers, live, strict=True)
                                    if method is not None]
        for method in live:
            if method is not None:
                method(seconds, self.engine.last_step_tokens)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """One call_soon_threadsafe per event loop a step, not one per request: each is a
        write to the loop's wake-up socket (64 of them a step at 64 streams)."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Sink, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            batches.setdefault(stream[0], []).append((stream[1], out))
        for loop, batch in batches.items():
            if not _send(loop, self._hand_out, batch):  # nobody will read these, nor abort them
                for _, out in batch:
                    if not out.finished:
                        self._abort(out.request_id)

    def _hand_out(self, batch: list[tuple[_Sink, RequestOutput]]) -> None:
        """On the requests' event loop. A sink that raises (a consumer's bug) costs only its own
        request, which is aborted; the others in the batch still get their outputs."""
        for sink, out in batch:
            try:  # a request that failed (its guide) ends in its error, as one refused at add does
                sink(out if out.error is None else GuidedDecodingError(out.error))
            except Exception:
                logger.exception("the consumer of request %s failed; aborting it", out.request_id)
                if not out.finished:
                    self._post(lambda rid=out.request_id: self._abort(rid))

    def _drain_and_stop(self) -> None:
        deadline = time.monotonic() + 5.0
        while not self._ops.empty() and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)

    def _snapshot(self, num_waiting: int | None = None) -> EngineStats:
        """The engine's counts now; num_waiting, if given, stands for the scheduler's."""
        scheduler = self.engine.scheduler.stats()
        if num_waiting is not None:
            scheduler = dataclasses.replace(scheduler, num_waiting=num_waiting)
        c = self.engine.counters
        return EngineStats(
            scheduler=scheduler,
            prompt_tokens_total=c.prompt_tokens, generation_tokens_total=c.generation_tokens,
            requests_finished=dict(c.requests_finished),
            spec_decode=(copy.deepcopy(self.engine.spec_counters)
                         if self.engine.config.speculative_config is not None else None),
        )


def _send(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> bool:
    """loop.call_soon_threadsafe from the engine thread; False when the loop is closed (its
    caller is gone), which must not take the engine thread down with it."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # "Event loop is closed"
        return False
    return True


def _shutting_down() -> EngineShuttingDownError:
    return EngineShuttingDownError("the engine is shutting down")


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
