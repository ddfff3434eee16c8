"""The access log counts the prompt of a request cancelled before its first output: one queued
behind another (one sequence at a time here), or a beam search (whose output comes whole, at
the end). It logged prompt_tokens=0: the count was read from the outputs, and there were none."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import Iterator

import httpx
import pytest
from server_helpers import MAX_MODEL_LEN, RunningServer, engine_idle, start_server, wait_until

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm_engine import LLMEngine

IDS = [504, 1834, 28, 638, 359, 346, 2000, 2011, 2022, 2033, 2044, 2055]  # 12 token ids


@pytest.fixture(scope="module")
def one_slot(engine) -> Iterator[RunningServer]:
    """A server whose engine runs one sequence at a time: a second request waits."""
    own = AsyncEngine(LLMEngine(EngineConfig(
        dtype=engine.engine.config.dtype, kv_cache_memory_bytes=24 * 2**20, max_num_seqs=1,
        max_model_len=MAX_MODEL_LEN), loaded=engine.engine.loaded))
    servers = start_server(own)
    yield next(servers)
    servers.close()
    asyncio.run(own.shutdown(timeout_s=0))


@contextlib.contextmanager
def _sent(server: RunningServer, body: dict) -> Iterator[None]:
    """A completion request sent on a connection of its own, closed (the client gone) on exit."""
    host, port = server.url.removeprefix("http://").split(":")
    content = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(content)}\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + content)
        yield


def _waiting(server: RunningServer) -> float:
    return server.metric("vllm:num_requests_waiting")


def _logged(caplog) -> list[str]:
    return [m for m in caplog.messages if "POST /v1/completions" in m]


def _prompt_tokens(line: str) -> int:
    match = re.search(r"status=499 prompt_tokens=(\d+) output_tokens=0 ", line)
    assert match, line
    return int(match.group(1))


@pytest.mark.parametrize(("fields", "expected"), [
    ({"prompt": IDS[:7]}, 7),
    ({"prompt": IDS, "truncate_prompt_tokens": 5}, 5),  # vLLM keeps the prompt's last 5
    ({"prompt": IDS, "truncate_prompt_tokens": -1}, 12),  # -1: up to the context length
])
def test_a_request_cancelled_while_queued_logs_its_prompt(one_slot, caplog, fields, expected):
    url = f"{one_slot.url}/v1/completions"
    running = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with caplog.at_level("INFO", logger="inferlab.server.access"):
        with httpx.stream("POST", url, json=running, timeout=60) as first:
            lines = first.iter_lines()  # held: a dropped iterator closes the stream
            next(lines)  # it holds the one slot until it is left
            with _sent(one_slot, {**fields, "max_tokens": 4}):  # then left while queued
                assert wait_until(lambda: _waiting(one_slot) == 1, 30)
            assert wait_until(lambda: _logged(caplog), 10)
            (queued,) = _logged(caplog)
        assert wait_until(lambda: engine_idle(one_slot), 10)
    assert _prompt_tokens(queued) == expected


def test_a_beam_search_cancelled_mid_search_logs_its_prompt(server, caplog):
    body = {"prompt": IDS[:9], "max_tokens": 400, "n": 2, "use_beam_search": True,
            "ignore_eos": True}
    with caplog.at_level("INFO", logger="inferlab.server.access"):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers,
                       timeout=1.5)
        assert wait_until(lambda: _logged(caplog), 10)
    (line,) = _logged(caplog)
    assert _prompt_tokens(line) == 9
    assert wait_until(lambda: engine_idle(server), 10)
