"""A guide's schema compiles in Python, for up to seconds on a big one: built on the event loop,
it held every other client and /health that long (a 214 KB schema: /health waited 6.9 s). The
request's sampling params are built in a worker thread, where no event loop runs."""

from __future__ import annotations

import asyncio

import httpx
from server_helpers import MODEL_NAME

from inferlab.server import chat, completions

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_sampling_params_with_a_guide_are_built_off_the_event_loop(server, monkeypatch):
    on_loop: list[bool] = []

    def watched(build):
        def run(*args, **kwargs):
            on_loop.append(_loop_running_here())
            return build(*args, **kwargs)
        return run

    monkeypatch.setattr(completions, "completion_params", watched(completions.completion_params))
    monkeypatch.setattr(chat, "chat_params", watched(chat.chat_params))
    guide = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
             "max_tokens": 8, "model": MODEL_NAME}
    for path, body in (("/v1/completions", {"prompt": "Hi", **guide}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], **guide})):
        r = httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=60)
        assert r.status_code == 200, r.text
    assert on_loop == [False, False]
