"""An explicit JSON null for a field that OpenAI's API reference lists as "or null" (and vLLM's
protocol.py declares Optional with a default) means the default, as if the field were left out;
it was a 400 ("Input should be a valid boolean")."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import MODEL_NAME

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 3, "temperature": 0.0}
COMPLETION = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 3,
              "temperature": 0.0}
# the fields vLLM declares `Optional[...] = <default>` (or None, meaning False)
SHARED_NULLS = ["stream", "n", "return_tokens_as_token_ids", "return_token_ids"]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers, timeout=60)


def _whole(server, path: str, body: dict) -> dict:
    r = _post(server, path, body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"  # stream null: not an event stream
    return r.json()


@pytest.mark.parametrize("field", [*SHARED_NULLS, "echo"])
def test_a_null_completion_field_is_its_default(server, field):
    default = _whole(server, "/v1/completions", COMPLETION)
    got = _whole(server, "/v1/completions", {**COMPLETION, field: None})
    assert [c["text"] for c in got["choices"]] == [c["text"] for c in default["choices"]]
    (choice,) = got["choices"]  # n: 1
    assert "token_ids" not in choice or choice["token_ids"] is None
    assert not choice["text"].startswith(COMPLETION["prompt"])  # echo: false


@pytest.mark.parametrize("field", [*SHARED_NULLS, "logprobs"])
def test_a_null_chat_field_is_its_default(server, field):
    default = _whole(server, "/v1/chat/completions", CHAT)
    got = _whole(server, "/v1/chat/completions", {**CHAT, field: None})
    (choice,) = got["choices"]
    assert choice["message"]["content"] == default["choices"][0]["message"]["content"]
    assert choice["logprobs"] is None


@pytest.mark.parametrize("field", ["include_usage"])
def test_null_stream_options_fields(server, field):
    """vLLM's StreamOptions declares include_usage Optional: null leaves the usage chunk out
    (a null continuous_usage_stats: test_stream_options.py)."""
    body = {**COMPLETION, "stream": True, "stream_options": {field: None}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(chunk.get("usage") is None and chunk["choices"] for chunk in chunks)


def test_a_null_return_token_strs_is_false(server):
    r = _post(server, "/tokenize", {"prompt": "Hello world", "return_token_strs": None})
    assert r.status_code == 200, r.text
    assert r.json().get("token_strs") is None


def test_chat_echo_stays_a_boolean(server):
    """vLLM declares chat's echo `bool` (not Optional): null is still refused, by name."""
    r = _post(server, "/v1/chat/completions", {**CHAT, "echo": None})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
