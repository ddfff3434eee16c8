"""stream_options as vLLM reads it: its StreamOptions declares `include_usage: Optional[bool] =
True` and `continuous_usage_stats: Optional[bool] = False`, and the serving code takes
include_usage = stream_options.include_usage whenever stream_options is given. So `{}` gets the
final usage chunk, and an explicit null include_usage (None) gets none; a null
continuous_usage_stats is no per-chunk usage. `{}` once got no usage at all."""

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
