"""The waiting count AsyncEngine.stats() gives between steps, which backpressure
(server/admission.py) reads: a queued request aborted leaves it at once, while requests added
since the last step do not enter it before a step has seen them (free slots may run them).

Steps are held one at a time, so each case reads the stats while a step is under way."""

from __future__ import annotations

import asyncio

import pytest

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.admission import Admission
from tests.engine.held_steps import HeldSteps, posted
from tests.models.tiny_tokenizer import save_tiny_llama

LONG = SamplingParams(max_tokens=100, ignore_eos=True, temperature=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("async-stats"))


def _engine(model_dir: str, max_num_seqs: int) -> AsyncEngine:
    return AsyncEngine.from_config(EngineConfig(model=model_dir, dtype="float32",
                                                max_num_seqs=max_num_seqs,
                                                kv_cache_memory_bytes=2**20))


def _counts(engine: AsyncEngine) -> tuple[int, int]:
    s = engine.stats().scheduler
    return s.num_running, s.num_waiting


async def _read(engine: AsyncEngine, request_id: str) -> str | None:
    """The request's finish reason, once it has finished."""
    outputs = [out async for out in engine.generate("w2 w3 w4", LONG, request_id)]
    return outputs[-1].outputs[0].finish_reason


async def _one_running_one_queued(engine: AsyncEngine, steps: HeldSteps) -> list[asyncio.Task]:
    """With 1 slot: "running" runs and "queued" waits at the last step; the next is held."""
    tasks = [asyncio.create_task(_read(engine, "running"))]
    await steps.wait_held()
    tasks.append(asyncio.create_task(_read(engine, "queued")))
    await posted(engine)  # its prompt is encoded first, off the loop: slow on a busy machine
    for _ in range(2):  # the held step ends, the add runs, and the step after it counts it
        await steps.next_step()
    assert _counts(engine) == (1, 1)
    return tasks


def test_a_queued_request_aborted_leaves_the_waiting_count_while_the_next_step_runs(model_dir):
    """1 slot: one request runs, one waits. The waiting one is aborted through
    AsyncEngine.abort while a step runs; once the abort has run, and before the next step
    ends, the stats show 1 running and 0 waiting. They showed 1 waiting until that step
    ended (backpressure counted a queue place taken by nothing)."""
    engine = _engine(model_dir, max_num_seqs=1)
    steps = HeldSteps(engine)

    async def main() -> None:
        running, queued = await _one_running_one_queued(engine, steps)
        await engine.abort("queued")  # posted while a step is held
        await steps.next_step()  # that step ends, the abort runs, the next step is held
        assert _counts(engine) == (1, 0)
        assert await asyncio.wait_for(queued, 10) == "abort"
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await steps.close()

    asyncio.run(main())


def test_a_request_added_and_aborted_between_two_steps_leaves_the_waiting_count(model_dir):
    """1 slot, one request running and one waiting; a third is added and aborted while a step
    runs (its client left at once). The last step never counted it, so the stats still show 1
    waiting, not 0, while the next step runs."""
    engine = _engine(model_dir, max_num_seqs=1)
    steps = HeldSteps(engine)

    async def main() -> None:
        tasks = await _one_running_one_queued(engine, steps)
        gone = asyncio.create_task(_read(engine, "gone"))
        await posted(engine)  # its add: the step held, it waits there
        gone.cancel()  # its abort is posted after its add
        await steps.next_step()  # that step ends, the add and the abort run, the next is held
        assert _counts(engine) == (1, 1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(gone, *tasks, return_exceptions=True)
        await steps.close()

    asyncio.run(main())


def test_a_burst_the_free_slots_take_does_not_count_as_waiting_before_its_step(model_dir):
    """2 slots, a queue of 1, an idle engine: a burst of 2 sequences is admitted and added
    at once, and their first step is held. They run in the free slots, so a third request
    takes the one queue place and a fourth is refused. A snapshot of the stats taken after the
    adds and before the step (515b303, reverted) counted the burst as 2 waiting until the step
    ended, and refused the third."""
    engine = _engine(model_dir, max_num_seqs=2)
    steps = HeldSteps(engine)
    gate = Admission(engine, max_queued=1)

    async def main() -> None:
        assert gate.try_admit(1) and gate.try_admit(1)
        await engine.submit_all([("b1", "w2 w3", lambda out: None),
                                 ("b2", "w4 w5", lambda out: None)], LONG)
        await steps.wait_held()  # the engine took both and is in their first step
        assert gate.try_admit(1)
        assert not gate.try_admit(1)
        await steps.close()

    asyncio.run(main())
