"""Clients that go away (killed mid-stream, a closed event loop, a whole request abandoned, a
stream left) and refused prompts: every request is aborted and every KV block freed, as
/metrics shows an operator. A request its client left is not a finished one: as vLLM, whose
frontend drops an aborted request unrecorded, request_success_total counts nothing for it (it
once counted 1 under finished_reason "abort"); a request run to its 400 tokens would count 1."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest
from server_helpers import VLLM_LABELS, engine_idle, requests_finished, wait_until

from inferlab.engine.sampling_params import SamplingParams

LONG = {"max_tokens": 400, "ignore_eos": True}  # far longer than any test waits for


_STREAMING_CLIENT = """
import sys, httpx
url, key = sys.argv[1], sys.argv[2]
body = {"prompt": "Once upon a time", "stream": True, "max_tokens": 400, "ignore_eos": True}
with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                  headers={"Authorization": "Bearer " + key}) as r:
    for line in r.iter_lines():
        if line.startswith("data: "):
            print("streaming", flush=True)
            sys.stdin.read()  # hold the connection open until killed
"""


def test_client_killed_mid_stream_frees_its_request_and_blocks(server):
    assert wait_until(lambda: engine_idle(server), 10)
    before = requests_finished(server)
    client = subprocess.Popen([sys.executable, "-c", _STREAMING_CLIENT, server.url, server.api_key],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "streaming"
        label = f"{{{VLLM_LABELS}}}"
        assert server.metrics()[f"vllm:num_requests_running{label}"] == 1
        assert server.metrics()[f"vllm:kv_cache_usage_perc{label}"] > 0
    finally:
        client.kill()  # SIGKILL: no goodbye, the socket just closes
        client.wait()
    assert wait_until(lambda: engine_idle(server), 10)
    assert requests_finished(server) == before  # aborted, and not counted


def test_a_refused_prompt_among_several_leaves_nothing_running(server):
    """Two prompts, the second refused (a token id past the vocabulary): a 400 before any
    response, and the first, already added, is aborted at once with its blocks freed, not run
    to its 400 tokens (several seconds here)."""
    assert wait_until(lambda: engine_idle(server), 10)
    r = httpx.post(f"{server.url}/v1/completions", headers={"Authorization": f"Bearer {server.api_key}"},
                   json={"prompt": [[1, 2, 3] * 10, [5, 10**7]], "max_tokens": 400, "ignore_eos": True},
                   timeout=60)
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]
    time.sleep(1.0)  # /metrics shows a snapshot: let the engine take the add (and the abort)
    assert wait_until(lambda: engine_idle(server), 0.5)


def test_a_caller_loop_closed_mid_request_does_not_stop_the_engine(engine):
    """An event loop that added a request and was closed while it ran (a script's asyncio.run
    that returned): the engine thread aborts the request instead of dying on the closed loop,
    and serves the next caller."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.submit("Once upon a time", SamplingParams(max_tokens=300, ignore_eos=True),
                                          "orphan", lambda out: None))
    loop.close()
    assert wait_until(lambda: engine.num_unfinished == 0 and engine.stats().scheduler.num_running == 0, 10)
    assert engine.is_healthy()

    async def next_caller():
        return [out async for out in engine.generate("Hi", SamplingParams(max_tokens=2), "after-orphan")]

    assert asyncio.run(next_caller())[-1].finished


def test_abandoned_whole_request_is_aborted(server):
    assert wait_until(lambda: engine_idle(server), 10)
    before = requests_finished(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=1.5,
                   json={"prompt": "Once upon a time", **LONG})
    assert wait_until(lambda: engine_idle(server), 10)
    assert requests_finished(server) == before


def test_a_stream_the_client_leaves_is_logged_as_499(server, caplog):
    """As a whole request the client leaves is (its 200 went out with the first chunk)."""
    assert wait_until(lambda: engine_idle(server), 10)
    with caplog.at_level("INFO", logger="inferlab.server.access"):
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers, timeout=30,
                          json={"prompt": "Once upon a time", "stream": True, **LONG}) as r:
            next(r.iter_lines())
        assert wait_until(lambda: engine_idle(server), 10)
        assert wait_until(lambda: any("POST /v1/completions" in m for m in caplog.messages), 10)
    (line,) = [m for m in caplog.messages if "POST /v1/completions" in m]
    assert "status=499" in line


def test_a_client_gone_before_its_body_came_is_a_499_without_a_traceback(server, caplog):
    """It was a 500 with two tracebacks in the log (Starlette's ClientDisconnect went unhandled)."""
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level("INFO", logger="inferlab.server"):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Authorization: Bearer {server.api_key}\r\n"
                         f"Content-Length: 100\r\n\r\n{{\"prompt\":".encode())
            time.sleep(0.3)
        assert wait_until(lambda: any("POST /v1/completions" in m for m in caplog.messages), 10)
    (line,) = [m for m in caplog.messages if "POST /v1/completions" in m]
    assert "status=499" in line
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info]
