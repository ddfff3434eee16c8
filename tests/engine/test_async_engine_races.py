"""AsyncEngine at its edges: a request racing shutdown, a consumer that raises, an engine that
died, and one LLM driven from two threads. Each case once hung or misreported (see each test)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine, EngineShuttingDownError, EngineStepError
from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from tests.models.tiny_tokenizer import save_tiny_llama

PARAMS = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("async-races"))


def _engine(model_dir: str) -> AsyncEngine:
    return AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32",
                                                kv_cache_memory_bytes=2**20))


async def _collect(engine: AsyncEngine, request_id: str, prompt="w2 w3 w4"):
    return [out async for out in engine.generate(prompt, PARAMS, request_id)]


def test_a_request_encoded_during_shutdown_is_refused_not_left_waiting(model_dir):
    """Its add landed after shutdown had listed the streams to abort (or after the thread had
    stopped): nothing ever answered it."""
    engine = _engine(model_dir)
    tokenize = engine.engine.tokenize_prompt

    def slow(*args, **kwargs):
        time.sleep(0.3)  # still encoding when the shutdown starts
        return tokenize(*args, **kwargs)

    engine.engine.tokenize_prompt = slow

    async def main() -> None:
        encoding = asyncio.create_task(_collect(engine, "encoding"))
        await asyncio.sleep(0.05)
        stopping = asyncio.create_task(engine.shutdown(0))
        await asyncio.sleep(0)
        late = asyncio.create_task(_collect(engine, "late"))
        await stopping
        for task in (encoding, late):
            with pytest.raises(InferlabError, match="shutting down"):
                await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert engine.engine.scheduler.stats().num_free_blocks == engine.engine.num_kv_blocks


def test_a_beam_search_whose_round_a_shutdown_aborts_ends_with_the_shutdown_error(model_dir):
    """The round's requests are aborted before their step: their outputs hold no token, which
    the search once read as its answer (a ValueError, a 400 at the server). No step runs here,
    so the abort always comes first."""
    engine = _engine(model_dir)
    engine.engine.step = lambda *args, **kwargs: []  # the round's requests wait, never run

    async def main() -> None:
        params = BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
        search = asyncio.create_task(engine.beam_search(
            *await engine.start_beam_search("w2 w3", params), "beam"))
        deadline = time.monotonic() + 10
        while not engine.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.num_unfinished == 1  # the first round: the prompt, its only beam
        await engine.shutdown(0)
        with pytest.raises(EngineShuttingDownError, match="shutting down"):
            await asyncio.wait_for(search, 10)

    asyncio.run(main())


def test_a_consumer_that_raises_costs_only_its_own_request(model_dir):
    """Its exception once dropped the outputs of every request handed out after it that step."""
    engine = _engine(model_dir)

    def broken(out) -> None:
        raise ValueError("a consumer's bug")

    async def main() -> list:
        await engine.submit("w2 w3", SamplingParams(max_tokens=50, ignore_eos=True), "bad", broken)
        outputs: asyncio.Queue = asyncio.Queue()
        await engine.submit("w2 w5", PARAMS, "good", outputs.put_nowait)
        got = [await asyncio.wait_for(outputs.get(), 10)]
        while not got[-1].finished:
            got.append(await asyncio.wait_for(outputs.get(), 10))
        return got

    try:
        got = asyncio.run(main())
        assert len(got[-1].outputs[0].token_ids) == 5
        deadline = time.monotonic() + 10  # "bad" is aborted, not run to its 50 tokens unread
        while engine.stats().scheduler.num_running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.stats().scheduler.num_running == 0
        assert engine.stats().generation_tokens_total < 50
    finally:
        asyncio.run(engine.shutdown(0))


def test_a_dead_engine_fails_its_streams_and_shuts_down_at_once(model_dir):
    """The streams got a bare RuntimeError, and shutdown(30) waited 30 s + 5 s for them."""
    engine = _engine(model_dir)
    step = engine.engine.step

    def failing_step(*args, **kwargs):
        if engine.engine.counters.generation_tokens >= 2:
            raise RuntimeError("a kernel bug")
        return step(*args, **kwargs)

    engine.engine.step = failing_step

    async def main() -> None:
        with pytest.raises(EngineStepError, match="a kernel bug"):
            await asyncio.wait_for(_collect(engine, "running"), 10)
        started = time.monotonic()
        await engine.shutdown(30)
        assert time.monotonic() - started < 3

    asyncio.run(main())
    assert not engine.is_healthy()


def test_one_llm_from_two_threads_is_a_clear_error(model_dir):
    """Each thread's steps finished the other's requests: a bare KeyError."""
    llm = LLM(model_dir, dtype="float32", kv_cache_memory="1MiB")
    step, inside, release = llm.engine.step, threading.Event(), threading.Event()

    def held_step(*args, **kwargs):
        inside.set()
        release.wait(10)
        return step(*args, **kwargs)

    llm.engine.step = held_step
    first = threading.Thread(target=llm.generate, args=(["w2 w3"], PARAMS))
    first.start()
    try:
        assert inside.wait(10)
        with pytest.raises(InferlabError, match="already generating in another thread"):
            llm.generate(["w4 w5"], PARAMS)
    finally:
        release.set()
        first.join(10)
    llm.engine.step = step
    assert len(llm.generate(["w4 w5"], PARAMS)[0].outputs[0].token_ids) == 5
