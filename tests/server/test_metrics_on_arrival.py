"""A request's outputs reach /metrics as the engine hands them over, whether or not the API
layer has read them yet, as vLLM's output processor records every engine output as it is made
(IterationStats.update_from_output, update_from_finished_request).

start() waits for every prompt's first output and keeps what comes meanwhile: those outputs
were once observed only when read, so a prompt that finished while another was still waiting
for its first token was never counted if the client left (its request still counted in
request_success_total), and the gaps between its tokens were all observed at once, as ~0 s."""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import IDLE_STATS, MAX_MODEL_LEN

from inferlab.engine.engine_counters import EngineStats
from inferlab.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.generation import Generation
from inferlab.server.metrics import ServerMetrics

_PROMPTS = [[5, 6, 7], [8, 9]]


class _Engine:
    """Takes the prompts and keeps each one's sink; the test hands out the outputs."""

    heartbeat = 0.0
    max_model_len = MAX_MODEL_LEN

    def __init__(self) -> None:
        self.sinks: list = []
        self.aborted: list[str] = []

    async def submit_all(self, requests, params, priority=0) -> list[list[int]]:
        self.sinks = [sink for _, _, sink in requests]
        return [list(prompt) for _, prompt, _ in requests]

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def observe_steps(self, method) -> None:
        """No engine steps to report: the tests feed outputs by hand."""

    def stats(self) -> EngineStats:
        return IDLE_STATS


def _output(tokens: int, delta: int, finish_reason: str | None, m: RequestMetrics) -> RequestOutput:
    completion = CompletionOutput(index=0, text="", token_ids=list(range(tokens)),
                                  finish_reason=finish_reason,
                                  token_ids_delta=list(range(tokens - delta, tokens)), metrics=m)
    return RequestOutput("r", None, _PROMPTS[0], [completion], finish_reason is not None, metrics=m)


def _count_and_sum(hist) -> tuple[float, float]:
    seen = {s.name.rsplit("_", 1)[-1]: s.value for family in hist.collect()
            for s in family.samples if not s.name.endswith(("_bucket", "_created"))}
    return seen["count"], seen["sum"]


def _prompt_0_outputs() -> list[RequestOutput]:
    """Prompt 0's three tokens, by hand: arrived at 0 s, scheduled at 0.1, first token at 0.2,
    last token and end at 0.5."""
    running = [RequestMetrics(0.0, 0.1, 0.2, 0.2 + 0.1 * i, None, i + 1, i + 1) for i in range(2)]
    ended = RequestMetrics(0.0, 0.1, 0.2, 0.5, 0.5, 3, 3)
    return [_output(1, 1, None, running[0]), _output(2, 1, None, running[1]),
            _output(3, 1, "length", ended)]


def _generation() -> tuple[Generation, _Engine, ServerMetrics]:
    engine = _Engine()
    metrics = ServerMetrics(engine, "m", lambda: 0)  # type: ignore[arg-type]
    gen = Generation(engine, _PROMPTS, SamplingParams(max_tokens=3), "r",  # type: ignore[arg-type]
                     metrics, on_close=lambda: None)
    return gen, engine, metrics


async def _started(gen, engine) -> asyncio.Task:
    """gen.start() running, once the engine holds its prompts' sinks."""
    start = asyncio.create_task(gen.start())
    while not engine.sinks:
        await asyncio.sleep(0)
    return start


def test_a_prompt_that_ended_while_another_waited_counts_though_the_client_left():
    """Prompt 0 runs to its end while prompt 1 waits for its first token; then the client goes
    (start() is cancelled) and prompt 1 is aborted. Prompt 0 is a finished request of 3 prompt
    tokens and 3 output tokens: TTFT 0.2 s, end to end 0.5 s, counted once each."""

    async def run() -> ServerMetrics:
        gen, engine, metrics = _generation()
        start = await _started(gen, engine)
        for out in _prompt_0_outputs():
            engine.sinks[0](out)
        await asyncio.sleep(0)
        start.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await start
        await gen.close()
        assert gen.request_ids[1] in engine.aborted
        return metrics

    metrics = asyncio.run(run())
    assert _count_and_sum(metrics.ttft_s) == (1, pytest.approx(0.2))
    assert _count_and_sum(metrics.e2e_s) == (1, pytest.approx(0.5))
    assert _count_and_sum(metrics.prompt_len) == (1, 3)
    assert _count_and_sum(metrics.output_len) == (1, 3)


def test_buffered_tokens_keep_the_gaps_they_arrived_with():
    """Prompt 0's three tokens arrive 50 ms apart while start() waits for prompt 1; the reply
    is read only after prompt 1's first output. Two gaps of ~50 ms each, as they arrived (they
    were once both observed at the read, ~0 s apart)."""

    async def run() -> ServerMetrics:
        gen, engine, metrics = _generation()
        start = await _started(gen, engine)
        for out in _prompt_0_outputs():
            engine.sinks[0](out)
            await asyncio.sleep(0.05)
        late = RequestMetrics(0.0, 0.3, 0.4, 0.4, 0.4, 1, 1)
        engine.sinks[1](RequestOutput("r1", None, _PROMPTS[1], [CompletionOutput(
            0, "", [1], "length", token_ids_delta=[1], metrics=late)], True, metrics=late))
        await start
        await gen.final_outputs()
        await gen.close()
        return metrics

    count, total = _count_and_sum(asyncio.run(run()).itl_s)
    assert count == 2
    assert 0.09 <= total < 0.5
