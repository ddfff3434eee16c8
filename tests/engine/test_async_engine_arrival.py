"""A request's arrival is when AsyncEngine got it, as vLLM's frontend stamps it before the
prompt is encoded, so its time to first token and e2e latency hold the wait for the step under
way; its queue time starts when the engine queues it, at vLLM's QUEUED event. Arrival was once
stamped on the engine thread, after that step: a request that came during a 2 s prefill chunk
reported up to 2 s less than its client waited.

Steps are held one at a time: the request comes while one is held, which is let go a known time
later."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.outputs import RequestMetrics
from inferlab.engine.sampling_params import SamplingParams
from tests.engine.held_steps import HeldSteps, posted
from tests.models.tiny_tokenizer import save_tiny_llama

PARAMS = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
HELD_S = 0.3  # how long the step under way is held after the request came


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("async-arrival"))


async def _metrics(engine: AsyncEngine, request_id: str) -> RequestMetrics:
    outputs = [out async for out in engine.generate("w2 w3 w4", PARAMS, request_id)]
    assert outputs[-1].finished and outputs[-1].metrics is not None
    return outputs[-1].metrics


def test_a_request_that_comes_during_a_step_arrives_when_it_was_submitted(model_dir):
    """"early" is in a held step; "late" is submitted then, its add posted to the engine
    thread, and the step is let go HELD_S later. late's arrival lies between its submit and
    its add being posted, before the step ends; it is queued after the step ends; its time to
    first token and e2e latency hold at least the HELD_S it waited for that step, its queue
    time does not (vLLM's starts at the engine's add)."""
    engine = AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32", max_num_seqs=2,
                                                  kv_cache_memory_bytes=2**20))
    steps = HeldSteps(engine)

    async def main() -> tuple[float, float, float, RequestMetrics]:
        early = asyncio.create_task(_metrics(engine, "early"))
        await steps.wait_held()
        submitted = time.monotonic()
        late = asyncio.create_task(_metrics(engine, "late"))
        await posted(engine)  # its prompt encoded, its add waits for the held step
        add_posted = time.monotonic()
        await asyncio.sleep(HELD_S)
        released = time.monotonic()
        steps.let_go()  # the held step ends, the add runs
        metrics = await asyncio.wait_for(late, 30)
        await asyncio.wait_for(early, 30)
        await engine.shutdown(0)
        return submitted, add_posted, released, metrics

    submitted, add_posted, released, m = asyncio.run(main())
    assert submitted <= m.arrival_time <= add_posted
    assert released <= m.queued_time <= m.first_scheduled_time <= m.first_token_time
    assert m.ttft_s >= released - add_posted >= HELD_S
    assert m.e2e_latency_s >= m.ttft_s
    assert m.queue_time_s == m.first_scheduled_time - m.queued_time < m.ttft_s - HELD_S
