"""The client's X-Request-Id names the request, as in vLLM (OpenAIServing._base_request_id reads
the header; its docs' example sends x-request-id "completion-test"): the reply's id is
"cmpl-<id>" or "chatcmpl-<id>", the x-request-id response header and the access log carry it.
It was ignored: every request got a fresh id."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
from server_helpers import MODEL_NAME, wait_until

COMPLETION = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _post(server, path: str, body: dict, request_id: str) -> httpx.Response:
    headers = {**server.headers, "X-Request-Id": request_id}
    r = httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize(("path", "body", "prefix"), [
    ("/v1/completions", COMPLETION, "cmpl-"), ("/v1/chat/completions", CHAT, "chatcmpl-")])
def test_the_clients_request_id_names_the_reply(server, path, body, prefix, caplog):
    with caplog.at_level("INFO", logger="inferlab.server.access"):
        r = _post(server, path, body, "trace-42")
        assert wait_until(lambda: any("id=trace-42 " in m for m in caplog.messages), 10)
    assert r.json()["id"] == f"{prefix}trace-42"
    assert r.headers["x-request-id"] == "trace-42"


def test_a_streams_chunks_carry_the_clients_request_id(server):
    headers = {**server.headers, "X-Request-Id": "stream-7"}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", headers=headers, timeout=60,
                      json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == "stream-7"
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert {json.loads(e)["id"] for e in events[:-1]} == {"chatcmpl-stream-7"}


@pytest.mark.parametrize("bad", ["x" * 256, "has space", "caf\u00e9"])
def test_a_request_id_unfit_for_a_log_line_gets_a_fresh_one(server, bad):
    """Over 255 characters, or not visible ASCII: the request is served under an id of its own."""
    headers = {**server.headers, "X-Request-Id": bad.encode("latin-1")}
    r = httpx.post(f"{server.url}/v1/completions", json=COMPLETION, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    fresh = r.headers["x-request-id"]
    assert fresh != bad and re.fullmatch(r"[0-9a-f]{16}", fresh)
    assert r.json()["id"] == f"cmpl-{fresh}"


def test_two_requests_under_one_id_are_both_served(server):
    """Two clients may pick the same id; the engine's own ids stay unique (as vLLM's internal
    ids do), so neither is refused for an id in use."""
    replies: list[httpx.Response] = []
    body = {**COMPLETION, "max_tokens": 32, "ignore_eos": True}
    threads = [threading.Thread(target=lambda: replies.append(
        _post(server, "/v1/completions", body, "shared"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.json()["id"] for r in replies] == ["cmpl-shared"] * 2
