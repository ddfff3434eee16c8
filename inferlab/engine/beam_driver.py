"""A beam search's rounds driven through an AsyncEngine, as vLLM's engine-client beam_search
drives them: each round's beams run as engine requests of their own (one token each) beside
everything else; beam_search.py says how a round's outputs make the next beams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from inferlab.engine.beam_search import BeamSearch
from inferlab.engine.outputs import RequestOutput
from inferlab.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inferlab.engine.async_engine import AsyncEngine

Observer = Callable[[RequestOutput], None]


async def run_rounds(engine: AsyncEngine, search: BeamSearch, request_id: str, priority: int,
                     on_output: Observer | None) -> bool:
    """Run the search's rounds until it is done; False when a round was aborted, which only a
    shutdown does to a round whose outputs are still read (they hold no token). on_output gets
    every output of the rounds' requests as it arrives: a search cancelled while a step ends
    its round's requests still has them observed, as they are counted."""
    round_params = search.params.round_params()
    while not search.done:
        outputs = await asyncio.gather(*(
            _last_output(engine, beam, round_params, f"{request_id}-{search.rounds}-{i}",
                         priority, on_output) for i, beam in enumerate(search.beams())))
        if any(out.outputs[0].finish_reason == "abort" for out in outputs):
            return False
        search.advance(list(outputs))
    return True


async def _last_output(engine: AsyncEngine, prompt: list[int], params: SamplingParams,
                       request_id: str, priority: int, on_output: Observer | None) -> RequestOutput:
    async for out in engine.generate(prompt, params, request_id, priority, on_output):
        last = out
    return last
