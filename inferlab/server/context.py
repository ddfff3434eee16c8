"""What every route shares: the engine, the settings, admission, metrics, the drain flag."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence

from fastapi import Request

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.admission import Admission
from inferlab.server.body import read_json_body
from inferlab.server.disconnect import unless, unless_disconnected
from inferlab.server.errors import APIError
from inferlab.server.generation import BeamGeneration, Generation
from inferlab.server.logprobs import TokenTexts, token_id_text
from inferlab.server.metrics import ServerMetrics
from inferlab.server.settings import ServerSettings


class ServerContext:
    def __init__(self, engine: AsyncEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.model_name = settings.served_model_name
        self.model_names = settings.model_names
        self.created = int(time.time())
        self.admission = Admission(engine, settings.max_queued_requests)
        self.metrics = ServerMetrics(engine, self.model_name, lambda: self.admission.in_flight)
        self.token_texts = TokenTexts(engine.tokenizer)
        self.draining = False  # set on SIGTERM: no new work, /health 503
        self.drain_started = asyncio.Event()

    def start_draining(self) -> None:
        self.draining = True
        self.drain_started.set()

    async def read_body(self, request: Request) -> dict:
        """The request's JSON body. One still coming in when the server starts shutting down is
        answered 503 at once: uvicorn would wait for it to the end of its grace period, then
        cancel it with a traceback."""
        return await unless(read_json_body(request, self.settings.max_request_body_bytes),
                            self.drain_started.wait(),
                            lambda: self._unavailable("shutting_down", "the server is shutting down"))

    def token_names(self, as_ids: bool) -> Callable[[int], str]:
        """How logprobs name a token: its text, or "token_id:<id>" (return_tokens_as_token_ids)."""
        return token_id_text if as_ids else self.token_texts

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            served = " or ".join(map(repr, self.model_names))
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                f"{served}", param="model", code="model_not_found")

    def reply_model_name(self, name: str | None) -> str:
        """The name a reply carries: the one the request asked by (checked), as vLLM answers."""
        return name if name in self.model_names else self.model_name

    def is_healthy(self) -> bool:
        return not self.draining and self.engine.is_healthy(self.settings.health_max_silence_s)

    def _unavailable(self, reason: str, message: str) -> APIError:
        self.metrics.reject(reason)
        return APIError(503, message, code=reason)

    async def generate(self, request: Request, prompts: Sequence[str | list[int]],
                       params: SamplingParams, priority: int = 0,
                       beam: BeamSearchParams | None = None) -> Generation:
        """Admit, hand to the engine, and wait for every prompt's first output; beam: a beam
        search instead (its output comes whole, at the end)."""
        if self.draining:
            raise self._unavailable("shutting_down", "the server is shutting down")
        num_seqs = len(prompts) * params.n
        if not self.admission.try_admit(num_seqs):
            raise self._unavailable("queue_full", f"the server is busy: "
                                    f"{self.admission.max_queued} sequences are already waiting; "
                                    "retry later")
        args = (self.engine, prompts, params, request.state.request_id, self.metrics)
        on_close = functools.partial(self.admission.release, num_seqs)
        gen = (Generation(*args, priority=priority, on_close=on_close) if beam is None else
               BeamGeneration(*args, priority=priority, on_close=on_close, beam=beam))
        request.state.generation = gen  # the access log reads its token counts and TTFT
        try:
            await unless_disconnected(request, gen.start())
        except BaseException:
            await gen.close()
            raise
        return gen
