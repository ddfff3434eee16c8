"""The mock server, checked with an independent HTTP client (httpx) and the openai SDK."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from inferlab.bench.mock import MockConfig
from inferlab.bench.mock_http import EMIT_BATCH, Emitter
from inferlab.bench.server_metrics import ServerTimeline, canonical, parse_prometheus
from inferlab.errors import InferlabError


@pytest.mark.parametrize("settings, message", [
    ({"ttft_ms": math.nan}, "--ttft-ms must be >= 0 and at most 31536000000 ms (a year), got nan"),
    ({"itl_ms": math.inf}, "--itl-ms must be >= 0 and at most 31536000000 ms (a year), got inf"),
    ({"error_rate": math.nan}, "--error-rate, --hang-rate and --close-rate must be >= 0"),
    ({"hang_rate": 0.6, "close_rate": 0.6}, "and sum to <= 1"),
    ({"tokens_per_chunk": 0}, "--tokens-per-chunk must be >= 1, got 0"),
    ({"max_running": -1}, "--max-running must be >= 0, got -1"),
    ({"default_max_tokens": 10, "max_model_len": 5},
     "--default-max-tokens (10) is above --max-model-len (5)"),
])
def test_mock_settings_that_are_not_finite_are_refused(settings, message):
    with pytest.raises(InferlabError, match=re.escape(message)):
        MockConfig(**settings)


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def test_streamed_completion_format(mock_server):
    url = mock_server(tokens_per_chunk=2)
    body = {"model": "m", "prompt": "one two three", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == [" the of", " and to", " in", ""]  # 5 tokens, 2 per chunk, then finish
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5,
                                   "total_tokens": 8}


@pytest.mark.parametrize(("options", "usage"), [(None, False), ({}, True), ({"include_usage": None}, False),
                                                ({"continuous_usage_stats": True}, True)])
def test_stream_options_usage_as_vllm_gives_it(mock_server, options, usage):
    """vLLM's StreamOptions: include_usage defaults to true once stream_options is given."""
    url = mock_server()
    body = {"model": "m", "prompt": "one", "max_tokens": 2, "stream": True, "stream_options": options}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as response:
        chunks = [json.loads(p) for p in sse_payloads(response)[:-1]]
    assert any(c.get("usage") for c in chunks) == usage


def test_openai_sdk_reads_the_chat_stream(mock_server):
    import openai

    url = mock_server()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        " the of and"
    assert chunks[-1].usage.completion_tokens == 3
    assert client.models.list().data[0].id == "mock-model"


def test_non_streamed_completion_and_health(mock_server):
    url = mock_server(default_max_tokens=4)
    response = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "a b"})
    assert response.json()["choices"][0]["text"] == " the of and to"
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/nope").status_code == 404


def test_injected_error_is_an_openai_error(mock_server):
    url = mock_server(error_rate=1.0)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "stream": True})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "injected error"


def test_injected_close_cuts_the_stream(mock_server):
    url = mock_server(close_rate=1.0)
    body = {"prompt": "x", "max_tokens": 8, "stream": True}
    with pytest.raises(httpx.HTTPError), httpx.stream(
            "POST", f"{url}/v1/completions", json=body, timeout=10) as response:
        list(response.iter_lines())


def test_injected_hang_stops_sending(mock_server):
    url = mock_server(hang_rate=1.0)
    body = {"prompt": "x", "max_tokens": 8, "stream": True}
    with pytest.raises(httpx.ReadTimeout), httpx.stream(
            "POST", f"{url}/v1/completions", json=body,
            timeout=httpx.Timeout(10, read=0.5)) as response:
        list(response.iter_lines())


def test_bad_request_body_is_a_400(mock_server):
    url = mock_server()
    response = httpx.post(f"{url}/v1/completions", content=b"{not json")
    assert response.status_code == 400


@pytest.mark.parametrize("fields, message", [
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    ({"max_completion_tokens": -3}, "max_tokens must be at least 1, got -3"),
    # three prompt words: 3 + 98 > 100, as a vLLM server with max_model_len 100 refuses it
    ({"max_tokens": 98}, "the request asks for 101 (3 in the prompt, 98 in the completion)"),
    ({"max_tokens": 2.7}, "max_tokens must be an integer, got 2.7"),
    ({"max_tokens": float("inf")}, "max_tokens must be an integer, got inf"),  # JSON's Infinity
    ({"max_tokens": "2.5"}, "max_tokens must be an integer, got '2.5'"),
    ({"max_tokens": [3]}, "max_tokens must be an integer, got [3]"),
])
def test_max_tokens_a_server_refuses_is_a_400(mock_server, fields, message):
    url = mock_server(max_model_len=100)
    body = json.dumps({"prompt": "one two three", "stream": True, **fields})  # inf: Infinity
    response = httpx.post(f"{url}/v1/completions", content=body.encode())
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    for lax, tokens in ((97.0, 97), ("96", 96), (True, 1)):  # as vLLM's non-strict pydantic reads them
        fits = httpx.post(f"{url}/v1/completions", json={"prompt": "one two three", "max_tokens": lax})
        assert fits.json()["usage"]["completion_tokens"] == tokens


def test_a_missing_max_tokens_takes_what_the_context_leaves(mock_server):
    """vLLM's default max_tokens is the context left after the prompt: the mock's default (16)
    is cut to it, and only a prompt that fills the context is refused."""
    url = mock_server(max_model_len=20)
    words = " ".join(["w"] * 10)
    answer = httpx.post(f"{url}/v1/completions", json={"prompt": words}).json()
    assert answer["usage"]["completion_tokens"] == 10
    full = httpx.post(f"{url}/v1/completions", json={"prompt": " ".join(["w"] * 20)})
    assert full.status_code == 400
    assert full.json()["error"]["message"] == ("this model's maximum context length is 20 tokens; "
                                               "the prompt has 20, which leaves no room for a "
                                               "completion")


def test_a_stream_due_at_once_is_written_a_batch_a_turn():
    """At --itl-ms 0 every chunk of a stream is due at once: written EMIT_BATCH a turn of the
    loop, so that the loop sees a client that left and serves the others in between (all of
    a 5,000,000-token stream in one turn once held every client of the mock for minutes)."""

    class Connection:
        closed = False

        def __init__(self) -> None:
            self.writes = 0

        def write(self, data: bytes) -> None:
            self.writes += 1

    async def run() -> list[int]:
        loop, conn = asyncio.get_running_loop(), Connection()
        count = 3 * EMIT_BATCH + 5
        chunks = [(i + 1, b"x") for i in range(count)]
        emitter = Emitter(conn, loop, chunks, [loop.time()] * count, stop_at=count)
        seen = []
        while not emitter.finished.done():
            await asyncio.sleep(0)  # one turn of the loop
            seen.append(conn.writes)
        return [n for n in dict.fromkeys(seen) if n]  # the writes seen after each turn

    assert asyncio.run(run()) == [EMIT_BATCH, 2 * EMIT_BATCH, 3 * EMIT_BATCH, 3 * EMIT_BATCH + 5]


def test_metrics_page_counts_prefix_cache_hits_by_blocks(mock_server):
    url = mock_server()
    shared = " ".join(f"w{i}" for i in range(32))  # two full 16-word blocks
    for tail in ("alpha beta", "gamma delta"):
        httpx.post(f"{url}/v1/completions", json={"prompt": f"{shared} {tail}",
                                                   "max_tokens": 1})
    values = canonical(parse_prometheus(httpx.get(f"{url}/metrics").text))
    assert values["prefix_cache_queries"] == 68  # 34 words, twice
    assert values["prefix_cache_hits"] == 32  # the second request hit both shared blocks
    assert values["running"] == 0 and values["waiting"] == 0


def test_prometheus_parsing_sums_label_sets_and_maps_names():
    text = """# HELP x
vllm:num_requests_running{model_name="a"} 3
vllm:num_requests_running{model_name="b"} 2
vllm:num_requests_waiting 4.0
llamacpp:kv_cache_usage_ratio 0.5
vllm:prefix_cache_hits_total{model_name="a"} 10 1700000000000
bad line
nan_metric NaN
"""
    values = parse_prometheus(text)
    assert values["vllm:num_requests_running"] == 5
    assert values["vllm:prefix_cache_hits_total"] == 10
    assert "nan_metric" not in values
    assert canonical(values) == {"running": 5, "waiting": 4.0, "kv_cache_usage": 0.5,
                                 "prefix_cache_hits": 10}


def test_rates_between_scrapes_follow_the_counters_growth():
    """Hand-worked: between scrapes 0->1 the drafts grew by 8 and the kept ones by 6 (0.75), then
    by 4 and 1 (0.25); no drafts between 2 and 3 (None). Prefix hits: 5 of 10, then a scrape
    that missed the series (None)."""
    timeline = ServerTimeline(True, "", [0.0, 1.0, 2.0, 3.0], {
        "draft_tokens": [2, 10, 14, 14], "accepted_draft_tokens": [1, 7, 8, 8],
        "prefix_cache_queries": [0, 10, None, 30], "prefix_cache_hits": [0, 5, None, 20]})
    assert timeline.draft_acceptance_rate() == [None, 0.75, 0.25, None]
    assert timeline.prefix_hit_rate() == [None, 0.5, None, None]
    text = ('vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 5\n')
    assert canonical(parse_prometheus(text)) == {"draft_tokens": 12, "accepted_draft_tokens": 5}


def _timed_stream(client: httpx.Client, url: str) -> tuple[float, float]:
    """(seconds to the first text, seconds to the end) of one 3-token streamed completion."""
    body = {"prompt": "x", "max_tokens": 3, "stream": True}
    sent = time.monotonic()
    first = None
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if first is None and line.startswith('data: {"'):
                first = time.monotonic() - sent
    return first, time.monotonic() - sent


def test_max_running_queues_streams_one_after_another(mock_server):
    # each stream takes 100 ms to its first token and 2 * 100 ms more to its third; with one
    # slot, three at once run back to back: first tokens at 0.1, 0.4, 0.7 s, ends at 0.3,
    # 0.6, 0.9 s (a queued stream that took its tokens from its arrival would end at 0.3 s)
    url = mock_server(ttft_ms=100, itl_ms=100, max_running=1)
    # one client made beforehand: making one (its TLS context) takes longer than a token
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(3) as pool:
        times = sorted(pool.map(lambda _: _timed_stream(client, url), range(3)))
    firsts, ends = zip(*times, strict=True)
    assert list(firsts) == pytest.approx([0.1, 0.4, 0.7], abs=0.12)
    assert list(ends) == pytest.approx([0.3, 0.6, 0.9], abs=0.12)
