"""stream_options as vLLM reads it: its StreamOptions declares `include_usage: Optional[bool] =
True` and `continuous_usage_stats: Optional[bool] = False`, and the serving code takes
include_usage = stream_options.include_usage whenever stream_options is given. So `{}` gets the
final usage chunk, and an explicit null include_usage (None) gets none; a null
continuous_usage_stats is no per-chunk usage. `{}` once got no usage at all.

Without stream, as vLLM's protocol refuses it: its validate_stream_options raises only when
`data.get("stream_options") and not data.get("stream")`, so an empty stream_options ({}, falsy)
passes with stream false or left out, and any option given (even null) without stream is a 400
naming stream_options. `{}` was once a 400 too."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import MODEL_NAME

ROUTES = {"chat/completions": {"messages": [{"role": "user", "content": "Say hi"}]},
          "completions": {"prompt": "The capital of France is"}}


def _chunks(server, route: str, options: dict) -> list[dict]:
    body = {"model": MODEL_NAME, **ROUTES[route], "max_tokens": 3, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": options}
    with httpx.stream("POST", f"{server.url}/v1/{route}", json=body, headers=server.headers,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("options", [{}, {"continuous_usage_stats": None},
                                     {"include_usage": True, "continuous_usage_stats": False}])
def test_stream_options_ask_for_the_usage_chunk_by_default(server, route, options):
    *replies, last = _chunks(server, route, options)
    assert replies and all(chunk["choices"] and chunk.get("usage") is None for chunk in replies)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 3


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("options", [{"include_usage": None}, {"include_usage": False},
                                     {"include_usage": None, "continuous_usage_stats": True}])
def test_include_usage_null_or_false_gets_no_usage(server, route, options):
    chunks = _chunks(server, route, options)
    assert chunks and all(chunk["choices"] and chunk.get("usage") is None for chunk in chunks)


def _post(server, route: str, **fields) -> httpx.Response:
    body = {"model": MODEL_NAME, **ROUTES[route], "max_tokens": 2, "temperature": 0.0,
            "ignore_eos": True, **fields}
    return httpx.post(f"{server.url}/v1/{route}", json=body, headers=server.headers, timeout=60)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("stream", [{"stream": False}, {}, {"stream": None}])
def test_empty_stream_options_pass_without_stream(server, route, stream):
    r = _post(server, route, stream_options={}, **stream)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("options", [{"include_usage": True}, {"include_usage": None},
                                     {"continuous_usage_stats": False}])
def test_stream_options_given_without_stream_are_refused(server, route, options):
    r = _post(server, route, stream=False, stream_options=options)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stream_options" and "stream" in error["message"]
