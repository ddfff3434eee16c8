"""What an engine failure is to the client once a generation has started: "the engine is
shutting down" is a 503, never the 500 of an engine bug (nor the 400 of a bad request)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from inferlab.engine.async_engine import EngineShuttingDownError
from inferlab.engine.guided.ebnf_parse import GrammarError
from inferlab.engine.guided.json_schema import SchemaError
from inferlab.engine.guided.regex_grammar import RegexError
from inferlab.engine.outputs import CompletionOutput, RequestOutput
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from inferlab.server.errors import APIError
from inferlab.server.generation import Generation


class _Engine:
    """Gives each prompt a first output, then the failure."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure

    async def submit_all(self, requests, params, priority=0) -> list[list[int]]:
        for request_id, prompt, sink in requests:
            sink(RequestOutput(request_id, None, list(prompt), [CompletionOutput(0, "", [], None)], False))
            sink(self.failure)
        return [list(prompt) for _, prompt, _ in requests]

    async def abort(self, request_id: str) -> None:
        pass


def _error_after_start(failure: BaseException) -> APIError:
    async def run() -> APIError:
        gen = Generation(_Engine(failure), [[5, 6]], SamplingParams(), "r",  # type: ignore[arg-type]
                         SimpleNamespace(), on_close=lambda: None)
        await gen.start()
        with pytest.raises(APIError) as caught:
            await gen.final_outputs()
        await gen.close()
        return caught.value

    return asyncio.run(run())


def test_a_shutdown_after_the_start_is_a_503():
    error = _error_after_start(EngineShuttingDownError("the engine is shutting down"))
    assert (error.status, error.code, error.message) == (503, "shutting_down",
                                                        "the engine is shutting down")


def test_an_engine_bug_after_the_start_stays_a_500():
    error = _error_after_start(RuntimeError("a kernel bug"))
    assert error.status == 500 and "a kernel bug" in error.message


class _RefusingEngine(_Engine):
    """Refuses the prompts as they are handed over (add_request's checks)."""

    async def submit_all(self, requests, params, priority=0) -> list[list[int]]:
        raise self.failure


def _error_at_start(failure: BaseException) -> APIError:
    async def run() -> APIError:
        gen = Generation(_RefusingEngine(failure), [[5, 6]], SamplingParams(), "r",  # type: ignore[arg-type]
                         SimpleNamespace(), on_close=lambda: None)
        with pytest.raises(APIError) as caught:
            await gen.start()
        return caught.value

    return asyncio.run(run())


def test_a_request_the_engine_refuses_is_a_400():
    error = _error_at_start(InferlabError("the prompt needs 70 blocks, the cache holds 64"))
    assert (error.status, error.message) == (400, "the prompt needs 70 blocks, the cache holds 64")


@pytest.mark.parametrize("failure", [SchemaError("schema: 'if' is not supported"),
                                     RegexError("pattern: lookahead is not supported"),
                                     GrammarError("grammar: 'root' matches no text")])
def test_a_guide_the_engine_cannot_compile_is_a_400(failure):
    assert _error_at_start(failure).status == 400


def test_an_internal_value_error_at_the_start_is_a_500_not_the_clients_fault():
    # the engine's own consistency checks raise plain ValueErrors: a server bug, not a bad request
    error = _error_at_start(ValueError("no running request to preempt"))
    assert error.status == 500 and "no running request to preempt" in error.message
