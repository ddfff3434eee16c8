"""One API request's engine requests (one per prompt), started together and read as one stream.

Each prompt's engine outputs are handed straight into one queue (AsyncEngine.submit_all), so
prompts run side by side in the engine's batches. `start()` returns once every prompt has its
first output, after the engine has accepted all of them at once: an invalid request fails
there, before any response has been sent and before any of its prompts runs, and becomes a 400.
`close()` is the single exit: whatever has not finished is aborted (its KV blocks are freed on
the engine's next turn) and the admission places are handed back.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from inferlab.engine.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineShuttingDownError,
    EngineStepError,
)
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.outputs import RequestOutput
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, InvalidParameterError, PromptError
from inferlab.server.errors import APIError, bad_request, parameter_error
from inferlab.server.metrics import OutputObserver, ServerMetrics
from inferlab.server.protocol import PromptTokensDetails, Usage

_Item = tuple[int, RequestOutput | BaseException]


class Generation:
    def __init__(self, engine: AsyncEngine, prompts: Sequence[str | list[int]],
                 params: SamplingParams, request_id: str, metrics: ServerMetrics,
                 on_close: Callable[[], None], priority: int = 0) -> None:
        self.engine = engine
        self.prompts = list(prompts)
        self.params = params
        self.priority = priority
        # the engine's ids are unique whatever the client named the request (X-Request-Id),
        # as vLLM makes its internal ids: two requests may share a name
        unique = f"{request_id}-{secrets.token_hex(4)}"
        self.request_ids = [f"{unique}-{i}" for i in range(len(self.prompts))]
        self._observer = OutputObserver(metrics)
        self._on_close = on_close
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._buffer: deque[_Item] = deque()  # outputs read by start(), not yet handed out
        self._latest: dict[int, RequestOutput] = {}
        # each prompt's tokens as the engine will read them, known once it has accepted them:
        # the count of a request cancelled before its first output (queued, or mid-search)
        self._prompt_lengths = [0] * len(self.prompts)
        self._finished: set[int] = set()
        self._closed = False
        self.first_token_time: float | None = None  # monotonic time of the first token: the access log
        self.cut_short = False  # closed before it finished: the client went away
        self.failed = False  # a prompt failed after its first output (an error event ends a stream)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(self._latest[i].prompt_token_ids) if i in self._latest else length
                   for i, length in enumerate(self._prompt_lengths))

    @property
    def output_tokens(self) -> int:
        return sum(len(c.token_ids) for out in self._latest.values() for c in out.outputs)

    def prompt_token_ids(self, index: int) -> list[int]:
        """Prompt `index`'s token ids, known from its first output on (start())."""
        return self._latest[index].prompt_token_ids

    def usage(self, reply_tokens: bool = True) -> Usage:
        """reply_tokens False: the reply carries none of the sampled tokens (echo with max_tokens
        0), so none is counted as a completion token."""
        cached = sum(out.num_cached_tokens for out in self._latest.values())
        return _usage(self.prompt_tokens, self.output_tokens if reply_tokens else 0, cached)

    def prompt_usage(self, index: int, completion_tokens: int) -> Usage:
        """Continuous usage stats: prompt `index`'s tokens (and those the prefix cache served)
        with one of its choices' tokens so far, as vLLM's num_prompt_tokens[prompt_idx] and
        previous_num_tokens[i]; known from the prompt's first output on (start())."""
        out = self._latest[index]
        return _usage(len(out.prompt_token_ids), completion_tokens, out.num_cached_tokens)

    async def start(self) -> None:
        """Hand every prompt to the engine; raises an APIError (or the PromptError) if the engine
        refuses one, and a 503 if the server shut down before any prompt had a token."""
        try:
            await self._submit()
        except Exception as e:
            await self.close()
            raise _start_error(e) from None
        started: set[int] = set()
        while len(started) < len(self.prompts):
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                await self.close()
                raise _start_error(item)
            self._note_first_token(item)
            started.add(index)
            self._latest[index] = item  # usage counts are right from the first chunk on
            self._buffer.append((index, item))
        if _none_started(self._latest.values()):  # a stream too: no header has gone out yet
            self._finished.update(started)
            await self.close()
            raise _shut_before_start()

    async def _submit(self) -> None:
        prompt_ids = await self.engine.submit_all(
            [(rid, prompt, functools.partial(self._arrive, i))
             for i, (rid, prompt) in enumerate(zip(self.request_ids, self.prompts, strict=True))],
            self.params, self.priority)
        self._prompt_lengths = [len(ids) for ids in prompt_ids]

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) until every prompt has finished."""
        while len(self._finished) < len(self.prompts):
            index, item = self._buffer.popleft() if self._buffer else await self._queue.get()
            if isinstance(item, BaseException):
                self.failed = True  # its prompts left are aborted here, not by the client
                raise _engine_error(item)
            self._record(index, item)
            yield index, item

    async def final_outputs(self) -> list[RequestOutput]:
        """Every prompt's finished output; a 503 where the engine aborted them all before their
        first token (the server shutting down: a client that went away reads nothing), which
        its client can retry elsewhere, rather than an empty answer."""
        async for _ in self.outputs():
            pass
        finals = [self._latest[i] for i in range(len(self.prompts))]
        if _none_started(finals):
            raise _shut_before_start()
        return finals

    async def close(self) -> None:
        """Abort what has not finished and release the admission; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._abort_unfinished()
        self._on_close()

    async def _abort_unfinished(self) -> None:
        for index, request_id in enumerate(self.request_ids):
            if index not in self._finished:
                self.cut_short = not self.failed
                # also covers a prompt whose add was still queued for the engine thread when
                # start() was cancelled: the abort is queued behind it
                await self.engine.abort(request_id)

    def _note_first_token(self, out: RequestOutput) -> None:
        """The access log's TTFT: when a token first came (an abort before one brings none)."""
        if self.first_token_time is None and any(c.token_ids for c in out.outputs):
            self.first_token_time = time.monotonic()

    def _arrive(self, index: int, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait((index, item))
        if isinstance(item, RequestOutput):
            # observed as the engine hands it over, read or not (vLLM's output processor
            # records outputs as the engine makes them): a prompt that finished while start()
            # waited for another counts though the client leaves, and the tokens start()
            # buffers keep the gaps they arrived with
            self._observer.output_arrived(index, item)

    def _record(self, index: int, out: RequestOutput) -> None:
        self._note_first_token(out)
        self._latest[index] = out
        if out.finished:
            self._finished.add(index)


class BeamGeneration(Generation):
    """A beam search request: each prompt's search runs as a task of its own (many engine
    requests a round), and its one output, the best beams, arrives as the finished output of a
    plain generation would; start() therefore returns when every search has ended."""

    def __init__(self, *args: Any, beam: BeamSearchParams, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.beam = beam
        self._tasks: list[asyncio.Task] = []
        self._rounds: dict[str, OutputObserver] = {}  # the rounds' unfinished engine requests

    async def _submit(self) -> None:
        # every prompt checked before any search starts: a refused one leaves none running
        searches = await asyncio.gather(*(self.engine.start_beam_search(prompt, self.beam)
                                          for prompt in self.prompts))
        self._prompt_lengths = [len(search.prompt_ids) for _, search in searches]
        for index, (rid, (text, search)) in enumerate(zip(self.request_ids, searches, strict=True)):
            task = asyncio.create_task(self.engine.beam_search(text, search, rid, self.priority,
                                                               on_output=self._round_output))
            task.add_done_callback(functools.partial(self._search_ended, index))
            self._tasks.append(task)

    def _round_output(self, out: RequestOutput) -> None:
        """An output of a round's beam as it arrives, read or not, an engine request of its own:
        it counts in the per-request histograms as any request does, as vLLM's beam_search runs
        each beam through generate() (the search's own output, no engine request, counts in
        none)."""
        observer = self._rounds.pop(out.request_id, None) or OutputObserver(self._observer.metrics)
        observer.output_arrived(0, out)
        if not out.finished:
            self._rounds[out.request_id] = observer

    def _search_ended(self, index: int, task: asyncio.Task) -> None:
        if not task.cancelled():
            self._arrive(index, task.exception() or task.result())

    async def _abort_unfinished(self) -> None:
        for task in self._tasks:
            task.cancel()  # the round's requests are aborted as their streams close
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


def _none_started(outputs: Iterable[RequestOutput]) -> bool:
    """Every prompt finished aborted before its first token: the server shut down first."""
    return all(out.finished and all(c.finish_reason == "abort" and not c.token_ids for c in out.outputs)
               for out in outputs)


def _shut_before_start() -> APIError:
    return APIError(503, "the server shut down before this request started", code="shutting_down")


def _start_error(error: BaseException) -> APIError | PromptError:
    """What the client gets for a request the engine refused; a PromptError goes on to the
    handler that knows which request field holds the prompt."""
    if isinstance(error, PromptError):
        return error
    if isinstance(error, InvalidParameterError):  # a value the model cannot take (a token id)
        return parameter_error(str(error))
    return _engine_error(error)


def _engine_error(error: BaseException) -> APIError:
    """What a request's failure is to the client, whenever it comes: the request's own fault
    (an InferlabError: refused at add, or a guide that could not go on) is a 400; the engine's
    is a 500, or a 503 where the server cannot take work now."""
    if isinstance(error, EngineShuttingDownError):  # an InferlabError, yet no fault of the request's
        return APIError(503, str(error), code="shutting_down")
    if isinstance(error, InferlabError):
        return bad_request(str(error))
    # the server stays up but can do no more work (a request the bug struck in its own steps: 500)
    if isinstance(error, EngineDeadError) and not isinstance(error, EngineStepError):
        return APIError(503, str(error), code="engine_dead")
    return APIError(500, f"the engine failed: {error}")
