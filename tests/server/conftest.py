"""One engine (the embedded SmolLM2-135M, float32) shared by every server test.

Loading the model is the slow part, so the engine lives for the session; the servers in front
of it are real uvicorn servers on ephemeral ports, in threads of this process, so a test can
also reach into the engine (stall its loop) while it talks HTTP to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from server_helpers import API_KEY, MAX_MODEL_LEN, RunningServer, start_server

from inferlab.config import EngineConfig
from inferlab.errors import ModelLoadError


@pytest.fixture(scope="session")
def engine():
    from inferlab.engine.async_engine import AsyncEngine

    try:
        engine = AsyncEngine.from_config(EngineConfig(
            dtype="float32", kv_cache_memory_bytes=64 * 2**20, max_model_len=MAX_MODEL_LEN))
    except ModelLoadError as e:
        pytest.skip(f"the embedded model is not available: {e}")
    yield engine
    asyncio.run(engine.shutdown(timeout_s=0))


@pytest.fixture(scope="session")
def server(engine) -> Iterator[RunningServer]:
    """The main server: an API key is required, bodies over 1 MiB get 413."""
    yield from start_server(engine, api_key=API_KEY, max_request_body_bytes=2**20)


@pytest.fixture(scope="session")
def client(server: RunningServer):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
