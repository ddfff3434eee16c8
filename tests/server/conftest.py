"""The engines (the embedded SmolLM2-135M) shared by the server tests.

`engine` runs in the platform's own dtype (bf16 where the CPU has AMX, as `inferlab serve`
runs by default), whose decode steps are several times faster than fp32's; `fp32_engine` is
there for the tests whose reference is transformers' fp32 model. Loading is slow, so each
lives for the session; the servers in front of them are real uvicorn servers on ephemeral
ports, in threads of this process, so a test can also reach into the engine (stall its loop)
while it talks HTTP to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from server_helpers import API_KEY, MAX_MODEL_LEN, RunningServer, start_server

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm_engine import LLMEngine
from inferlab.errors import ModelLoadError


def _session_engine(dtype: str):
    from inferlab.engine.async_engine import AsyncEngine

    try:
        engine = AsyncEngine.from_config(EngineConfig(
            dtype=dtype, kv_cache_memory_bytes=64 * 2**20, max_model_len=MAX_MODEL_LEN))
    except ModelLoadError as e:
        pytest.skip(f"the embedded model is not available: {e}")
    yield engine
    asyncio.run(engine.shutdown(timeout_s=0))


@pytest.fixture(scope="session")
def engine():
    yield from _session_engine("auto")


@pytest.fixture(scope="session")
def fp32_engine():
    yield from _session_engine("float32")


def _openai_client(server: RunningServer):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def server(engine) -> Iterator[RunningServer]:
    """The main server: an API key is required, bodies over 1 MiB get 413."""
    yield from start_server(engine, api_key=API_KEY, max_request_body_bytes=2**20)


@pytest.fixture(scope="session")
def client(server: RunningServer):
    return _openai_client(server)


@pytest.fixture(scope="session")
def fp32_server(fp32_engine) -> Iterator[RunningServer]:
    yield from start_server(fp32_engine, api_key=API_KEY)


@pytest.fixture(scope="session")
def fp32_client(fp32_server: RunningServer):
    return _openai_client(fp32_server)


@pytest.fixture(scope="module")
def speculating(fp32_engine):
    """A server whose engine drafts n-gram tokens (prompt lookup)."""
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=24 * 2**20, max_model_len=MAX_MODEL_LEN,
                          speculative_config={"num_speculative_tokens": 4, "prompt_lookup_max": 3})
    own = AsyncEngine(LLMEngine(config, loaded=fp32_engine.engine.loaded))
    servers = start_server(own)
    yield next(servers)
    servers.close()
    asyncio.run(own.shutdown(timeout_s=0))
