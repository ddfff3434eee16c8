"""stream_options without stream, as vLLM's protocol refuses it: its validate_stream_options
raises only when `data.get("stream_options") and not data.get("stream")`, so an empty
stream_options ({}, falsy) passes with stream false or left out, and any option given (even
null) without stream is a 400 naming stream_options. `{}` was once a 400 too."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL_NAME

ROUTES = {"chat/completions": {"messages": [{"role": "user", "content": "Say hi"}]},
          "completions": {"prompt": "The capital of France is"}}


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
