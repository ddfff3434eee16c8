"""Overload, a stalled or dead engine, metrics, and many concurrent streams, checked from outside
(disconnects: test_server_disconnect.py).

KV blocks and running requests are read through /metrics, as an operator would read them.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from server_helpers import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    OWN_LABELS,
    VLLM_LABELS,
    async_client,
    engine_idle,
    start_server,
    wait_until,
)

from inferlab.config import EngineConfig
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm_engine import LLMEngine


def _gate_engine(engine, monkeypatch) -> threading.Event:
    """Hold every engine step until the returned event is set (a busy engine, on demand)."""
    gate = threading.Event()
    step = engine.engine.step

    def gated_step():
        gate.wait(timeout=60)
        return step()

    monkeypatch.setattr(engine.engine, "step", gated_step)
    return gate


def test_overload_gets_503_past_the_slots_and_queue_while_admitted_requests_complete(engine, server,
                                                                                   monkeypatch):
    """4 slots (--max-num-seqs) and a queue of 4, the engine held at its first step: of 12
    requests at once, 8 are admitted (4 to run, 4 to wait) and complete, 4 get 503. The running
    count of the engine's last step (none) once made every admitted one count as waiting: 4
    were admitted and 8 refused."""
    body = {"model": MODEL_NAME, "prompt": "The three primary colours are", "max_tokens": 8,
            "temperature": 0.0, "ignore_eos": True}
    expected = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers,
                          timeout=60).json()["choices"][0]["text"]
    own = AsyncEngine(LLMEngine(EngineConfig(
        dtype=engine.engine.config.dtype, kv_cache_memory_bytes=24 * 2**20, max_num_seqs=4,
        max_model_len=MAX_MODEL_LEN), loaded=engine.engine.loaded))
    servers = start_server(own, max_queued_requests=4)
    busy = next(servers)
    try:
        # each reason's series from 0 (rate() sees the first), and no *_created beside them
        assert busy.metric("inferlab:requests_rejected_total", reason="queue_full") == 0
        assert busy.metric("inferlab:requests_rejected_total", reason="shutting_down") == 0
        assert not [name for name in busy.metrics() if "_created" in name]
        gate = _gate_engine(own, monkeypatch)

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as http:
                tasks = [asyncio.create_task(http.post(f"{busy.url}/v1/completions", json=body))
                         for _ in range(12)]
                deadline = time.monotonic() + 30
                while sum(t.done() for t in tasks) < 4 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                gate.set()  # the engine gets going again; the admitted ones must complete
                return await asyncio.gather(*tasks)

        responses = asyncio.run(burst())
        ok = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 503]
        assert (len(ok), len(refused)) == (8, 4)
        assert all(r.json()["choices"][0]["text"] == expected for r in ok)
        for r in refused:
            assert r.headers["retry-after"] == "1"
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "queue_full" and "retry" in error["message"]
        assert busy.metric("inferlab:requests_rejected_total", reason="queue_full") == 4
        assert httpx.get(f"{busy.url}/health", timeout=10).status_code == 200
        assert wait_until(lambda: engine_idle(busy), 10)
    finally:
        servers.close()
        asyncio.run(own.shutdown(timeout_s=0))


def test_health_turns_503_while_the_engine_loop_is_stalled(engine, monkeypatch):
    servers = start_server(engine, health_max_silence_s=1.0)
    watched = next(servers)
    try:
        assert httpx.get(f"{watched.url}/health", timeout=10).status_code == 200
        step = engine.engine.step
        stalled = threading.Event()

        def stalling_step():
            if not stalled.is_set():
                stalled.set()
                time.sleep(4.0)  # a step that hangs, as a wedged kernel or deadlock would
            return step()

        monkeypatch.setattr(engine.engine, "step", stalling_step)
        result: list[httpx.Response] = []
        request = threading.Thread(target=lambda: result.append(httpx.post(
            f"{watched.url}/v1/completions", timeout=60,
            json={"prompt": "Hi", "max_tokens": 2, "ignore_eos": True})))
        request.start()
        statuses = []
        wait_until(lambda: statuses.append(httpx.get(f"{watched.url}/health", timeout=10))
                   or statuses[-1].status_code == 503, 6)
        assert statuses[-1].status_code == 503
        assert statuses[-1].json()["error"]["type"] == "service_unavailable"
        request.join(timeout=60)
        assert result and result[0].status_code == 200  # the stalled request still completes
        assert wait_until(lambda: httpx.get(f"{watched.url}/health", timeout=10).status_code == 200, 5)
    finally:
        servers.close()


def test_metrics_count_every_engine_step(server):
    """One request alone: P prompt tokens in one step, then T - 1 single-token decode steps, so
    the step histograms gain T observations holding P + T - 1 tokens."""
    assert wait_until(lambda: engine_idle(server), 10)
    prompt, max_tokens = [1000 + 7 * i for i in range(20)], 6  # ids no other test sends

    def totals() -> tuple[float, float, float]:
        m = server.metrics()
        return (m[f"vllm:iteration_tokens_total_count{{{VLLM_LABELS}}}"],
                m[f"vllm:iteration_tokens_total_sum{{{VLLM_LABELS}}}"],
                m[f"inferlab:engine_step_duration_seconds_count{{{OWN_LABELS}}}"])

    before = totals()
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                         "temperature": 0.0, "ignore_eos": True})
    assert r.status_code == 200
    after = totals()
    assert after[0] - before[0] == max_tokens
    assert after[1] - before[1] == len(prompt) + max_tokens - 1
    assert after[2] - before[2] == max_tokens


def test_metrics_add_up_for_one_request_by_hand(server):
    """One request alone, n = 2, P prompt tokens, T tokens per completion (no stop). As in vLLM,
    which runs each completion as a child request of its own, each completion counts as a
    request: the totals gain 2P prompt and 2T generated tokens and two "length" finishes; the
    prompt and output length histograms two observations each, of P and of T; each latency
    histogram two observations, queue <= TTFT <= end to end <= the client's wall time, queue +
    prefill <= TTFT and prefill + decode = inference <= end to end; the inter-token histogram
    2 (T - 1) gaps, one per token after each completion's first; one request of n = 2 and a
    longest completion of T."""
    assert wait_until(lambda: engine_idle(server), 10)
    prompt, max_tokens = [2000 + 11 * i for i in range(23)], 7  # ids no other test sends
    names = {"prompt": "vllm:prompt_tokens_total", "generated": "vllm:generation_tokens_total",
             "prompt_len": "vllm:request_prompt_tokens_sum", "output_len": "vllm:request_generation_tokens_sum",
             "lengths": "vllm:request_prompt_tokens_count", "itl": "vllm:inter_token_latency_seconds_count"}
    names["n"] = "vllm:request_params_n_sum"
    names["longest"] = "vllm:request_max_num_generation_tokens_sum"
    for hist in ("time_to_first_token", "e2e_request_latency", "request_queue_time",
                 "request_prefill_time", "request_decode_time", "request_inference_time",
                 "request_time_per_output_token"):
        names[hist] = f"vllm:{hist}_seconds_sum"
        names[hist + "_n"] = f"vllm:{hist}_seconds_count"

    def read() -> dict[str, float]:
        m = server.metrics()
        label = f"{{{VLLM_LABELS}}}"
        values = {key: m[name + label] for key, name in names.items()}
        values["length"] = server.metric("vllm:request_success_total", finished_reason="length")
        return values

    before = read()
    start = time.monotonic()
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "n": 2,
                         "temperature": 1.0, "seed": 3, "ignore_eos": True})
    wall_s = time.monotonic() - start
    assert r.status_code == 200
    delta = {key: value - before[key] for key, value in read().items()}
    assert (delta["prompt"], delta["generated"], delta["length"]) == (2 * 23, 2 * max_tokens, 2)
    assert (delta["lengths"], delta["prompt_len"], delta["output_len"]) == (2, 2 * 23, 2 * max_tokens)
    assert delta["itl"] == 2 * (max_tokens - 1)
    assert delta["time_to_first_token_n"] == delta["e2e_request_latency_n"] == delta["request_queue_time_n"] == 2
    assert 0 <= delta["request_queue_time"] <= delta["time_to_first_token"] <= delta["e2e_request_latency"] <= 2 * wall_s
    assert (delta["n"], delta["longest"], delta["request_time_per_output_token_n"]) == (2, max_tokens, 2)
    # TTFT runs from arrival at the server's engine, before encoding, and queue time from the
    # scheduler's queue (as vLLM's from its frontend and its engine core): the encoding between
    assert delta["request_queue_time"] + delta["request_prefill_time"] <= delta["time_to_first_token"]
    assert delta["request_prefill_time"] + delta["request_decode_time"] == pytest.approx(
        delta["request_inference_time"], abs=1e-6)
    assert delta["request_inference_time"] <= delta["e2e_request_latency"]
    # the two completions decode side by side: T - 1 tokens' time each, not 2T - 1
    assert delta["request_time_per_output_token"] * (max_tokens - 1) == pytest.approx(
        delta["request_decode_time"], rel=1e-6)


def test_a_scrape_after_a_reply_finds_it_counted(server, monkeypatch):
    """The engine thread refreshes the figures /metrics reads before it hands a step's outputs
    out, however long that takes: a slow refresh stands in for the thread losing its core."""
    assert wait_until(lambda: engine_idle(server), 10)
    snapshot = server.engine._snapshot

    def slow_snapshot():
        time.sleep(0.3)
        return snapshot()

    label = f"{{{VLLM_LABELS}}}"
    before = server.metrics()[f"vllm:generation_tokens_total{label}"]
    monkeypatch.setattr(server.engine, "_snapshot", slow_snapshot)
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    m = server.metrics()
    assert m[f"vllm:generation_tokens_total{label}"] - before == r.json()["usage"]["completion_tokens"] == 3
    assert m[f"vllm:num_requests_running{label}"] == 0


def test_a_dead_engine_fails_queued_and_new_requests_at_once(engine, monkeypatch):
    """A step that raises (a bug) stops the engine loop: the request in the step gets a 500, a
    request queued behind it and every later one a 503, at once rather than when the client
    gives up; /health turns 503."""
    own = AsyncEngine(LLMEngine(EngineConfig(dtype=engine.engine.config.dtype, kv_cache_memory_bytes=24 * 2**20,
                                             max_model_len=MAX_MODEL_LEN), loaded=engine.engine.loaded))
    servers = start_server(own)
    broken = next(servers)
    gate, stepping = threading.Event(), threading.Event()

    def failing_step():
        stepping.set()
        gate.wait(30)
        raise RuntimeError("a kernel bug")

    monkeypatch.setattr(own.engine, "step", failing_step)
    body = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
    results: dict[str, httpx.Response] = {}

    def post(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, httpx.post(
            f"{broken.url}/v1/completions", json=body, timeout=20)))
        thread.start()
        return thread

    try:
        first = post("in the step")
        assert stepping.wait(30)
        queued = post("queued")
        # admitted; its add then waits in the engine thread's queue behind the stuck step
        assert wait_until(lambda: broken.metric("inferlab:num_requests_in_flight") == 2, 10)
        time.sleep(0.5)
        gate.set()
        first.join(60)
        queued.join(60)
        assert results["in the step"].status_code == 500
        assert results["queued"].status_code == 503
        started = time.monotonic()
        later = httpx.post(f"{broken.url}/v1/completions", json=body, timeout=60)
        assert later.status_code == 503 and time.monotonic() - started < 5
        assert later.json()["error"]["code"] == "engine_dead"
        assert "restart" in later.json()["error"]["message"]
        assert httpx.get(f"{broken.url}/health", timeout=10).status_code == 503
    finally:
        gate.set()
        servers.close()
        asyncio.run(own.shutdown(timeout_s=0))


# 4 prompts x 8 copies: the copies also share prompt blocks through the prefix cache
PROMPTS = ["The capital of France is", "Water boils at", "My favourite book is",
           "To bake bread you need"]


def test_32_concurrent_streams_match_one_at_a_time(server):
    async def stream_text(client, prompt: str) -> str:
        chunks = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10,
                                                 temperature=0.0, stream=True,
                                                 extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in chunks])

    async def one_at_a_time() -> dict[str, str]:
        async with async_client(server) as client:
            return {p: await stream_text(client, p) for p in PROMPTS}

    async def all_at_once() -> tuple[list[str], float]:
        peak = 0.0
        done = asyncio.Event()

        async def watch_running() -> None:
            nonlocal peak
            async with httpx.AsyncClient(timeout=10) as http:
                while not done.is_set():
                    text = (await http.get(f"{server.url}/metrics")).text
                    for line in text.splitlines():
                        if line.startswith("vllm:num_requests_running{"):
                            peak = max(peak, float(line.split()[-1]))
                    await asyncio.sleep(0.05)

        async with async_client(server) as client:
            watcher = asyncio.create_task(watch_running())
            texts = await asyncio.gather(*(stream_text(client, PROMPTS[i % len(PROMPTS)])
                                           for i in range(32)))
            done.set()
            await watcher
        return texts, peak

    reference = asyncio.run(one_at_a_time())
    texts, peak_running = asyncio.run(all_at_once())
    assert texts == [reference[PROMPTS[i % len(PROMPTS)]] for i in range(32)]
    assert all(len(t) > 0 for t in texts)
    assert peak_running >= 16  # they really ran side by side in the engine


def test_prompts_are_encoded_off_the_event_loop_and_hopeless_ones_not_at_all(server, monkeypatch):
    """Encoding lets go of the GIL, so it runs in a worker thread while the loop streams; a
    text longer than the context can hold whatever its tokens is refused before encoding."""
    tokenizer = server.engine.tokenizer
    encode, calls = tokenizer.encode, []

    def watched(text, *args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        calls.append((len(text), on_loop))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", watched)
    url, headers = f"{server.url}/v1", server.headers
    for path, body in (("completions", {"prompt": "Hello there"}),
                       ("completions", {"prompt": "Hello there", "add_special_tokens": False}),
                       ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        r = httpx.post(f"{url}/{path}", headers=headers, timeout=60,
                       json={"model": MODEL_NAME, "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/tokenize", headers=headers, timeout=60, json={"prompt": "Hello"})
    assert r.status_code == 200
    assert len(calls) == 4 and not any(on_loop for _, on_loop in calls)

    calls.clear()
    hopeless = "a" * (4 * tokenizer.max_token_chars * (server.engine.max_model_len + 1))
    r = httpx.post(f"{url}/completions", headers=headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": hopeless, "max_tokens": 1})
    assert r.status_code == 400 and "at least" in r.json()["error"]["message"]
    chat = httpx.post(f"{url}/chat/completions", headers=headers, timeout=60, json={
        "model": MODEL_NAME, "max_tokens": 1, "messages": [{"role": "user", "content": hopeless}]})
    assert chat.status_code == 400 and "at least" in chat.json()["error"]["message"]
    assert calls == []
    kept = httpx.post(f"{url}/completions", headers=headers, timeout=60, json={
        "model": MODEL_NAME, "prompt": hopeless, "max_tokens": 1, "truncate_prompt_tokens": 8})
    assert kept.status_code == 200 and kept.json()["usage"]["prompt_tokens"] == 8


def test_a_refused_prompt_of_many_leaves_none_of_the_others_running(server, monkeypatch):
    """Once the 400 went out while the other prompts were still being encoded: their adds
    reached the engine after the request's aborts and ran to max_tokens with no reader."""
    tokenizer = server.engine.tokenizer
    encode = tokenizer.encode

    def slow(text, *args, **kwargs):
        time.sleep(0.5)  # still encoding when the hopeless prompt is refused
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", slow)
    hopeless = "a" * (4 * tokenizer.max_token_chars * (server.engine.max_model_len + 1))
    assert wait_until(lambda: engine_idle(server), timeout_s=30)  # nothing else generating
    generated = server.metric("vllm:generation_tokens_total")
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60, json={
        "model": MODEL_NAME, "prompt": [hopeless] + [f"Story {i}: dragons" for i in range(4)],
        "max_tokens": 400, "ignore_eos": True})
    assert r.status_code == 400 and "at least" in r.json()["error"]["message"]
    time.sleep(1.5)  # past the other prompts' encoding: any add of theirs has reached the engine
    assert wait_until(lambda: engine_idle(server), timeout_s=30)
    # a few steps' tokens between the adds and their aborts (the loop's turn), not 400 each
    assert server.metric("vllm:generation_tokens_total") - generated < 400
