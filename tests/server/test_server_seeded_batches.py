"""A seeded bf16 request through the real HTTP server, alone and amid concurrent traffic: the same
text and logprobs. A small step budget makes the busy server cut its prompt into other chunks
and run it in other decode batches than alone, which is what a seed has to survive (issue 3: "a
per-request seed that makes sampling reproducible whatever else is in the batch")."""

from __future__ import annotations

import asyncio
import random

import pytest
from server_helpers import MAX_MODEL_LEN, MODEL_NAME, async_client, start_server

from inferlab.config import EngineConfig
from tests.markers import bf16_kernels

pytestmark = bf16_kernels


@pytest.fixture(scope="module")
def bf16_server():
    from inferlab.engine.async_engine import AsyncEngine

    engine = AsyncEngine.from_config(EngineConfig(
        dtype="bfloat16", kv_cache_memory_bytes=32 * 2**20, max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=48, max_num_seqs=48))
    yield from start_server(engine)
    asyncio.run(engine.shutdown(timeout_s=0))


def test_a_seeded_request_samples_alike_alone_and_in_a_busy_server(bf16_server):
    gen = random.Random(4)
    prompt = [gen.randrange(100, 40000) for _ in range(61)]  # alone: chunks of 48 and 13
    seeded = dict(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=1.0, seed=11,
                  logprobs=1, extra_body={"ignore_eos": True})

    async def serve():
        client = async_client(bf16_server)
        alone = await client.completions.create(**seeded)
        others = [client.completions.create(
            model=MODEL_NAME, prompt=[gen.randrange(100, 40000) for _ in range(5 + 9 * i)],
            max_tokens=24, temperature=0.7, extra_body={"ignore_eos": True}) for i in range(6)]
        busy, *_ = await asyncio.gather(client.completions.create(**seeded), *others)
        return alone.choices[0], busy.choices[0]

    alone, busy = asyncio.run(serve())
    assert busy.text == alone.text
    assert busy.logprobs.token_logprobs == alone.logprobs.token_logprobs
