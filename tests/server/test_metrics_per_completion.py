"""vLLM's per-request metrics, counted per completion and when vLLM counts them.

vLLM V1 runs each of a request's n completions as a child request of its own (AsyncLLM's
ParentRequest): prompt_tokens_total and every per-request histogram count each child; only
request_params_n and request_max_num_generation_tokens count the parent, once its last child
has finished (ParentRequest.observe_finished_request). The time to first token is observed as
that token arrives (IterationStats.update_from_output), whatever becomes of the request later;
the rest when a child finishes (update_from_finished_request), never for a request the client
aborted (OutputProcessor.abort_requests drops its state unrecorded); the time per output token
of a one-token child is 0. These were once counted per parent, at its end only, and not at all
for a request with an aborted completion."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import MODEL_NAME, VLLM_LABELS, IdleEngine, engine_idle, wait_until

from inferlab.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferlab.server.metrics import OutputObserver, ServerMetrics

_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds", "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds", "inference": "vllm:request_inference_time_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds", "prompt_len": "vllm:request_prompt_tokens",
    "output_len": "vllm:request_generation_tokens", "n": "vllm:request_params_n",
    "longest": "vllm:request_max_num_generation_tokens",
}


def _read(server) -> dict[str, float]:
    m = server.metrics()
    label = f"{{{VLLM_LABELS}}}"
    values = {"prompt_total": m[f"vllm:prompt_tokens_total{label}"]}
    for key, name in _HISTOGRAMS.items():
        values[key + "_n"] = m[f"{name}_count{label}"]
        values[key] = m[f"{name}_sum{label}"]
    return values


def _delta(server, before: dict[str, float]) -> dict[str, float]:
    return {key: value - before[key] for key, value in _read(server).items()}


def test_n_one_token_completions_count_as_n_requests(server):
    """n = 2, max_tokens 1, a prompt of 23 tokens: 46 prompt tokens; two observations in each
    per-request histogram (prompts of 23, one token each, 0 s per output token each); one
    request of n = 2 whose longest completion is 1 token."""
    assert wait_until(lambda: engine_idle(server), 10)
    prompt = [2100 + 7 * i for i in range(23)]
    before = _read(server)
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "n": 2,
                         "temperature": 1.0, "seed": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    d = _delta(server, before)
    assert d["prompt_total"] == 46
    for key in ("ttft", "e2e", "queue", "prefill", "decode", "inference", "tpot", "prompt_len",
                "output_len"):
        assert d[key + "_n"] == 2, key
    assert (d["prompt_len"], d["output_len"], d["tpot"], d["decode"]) == (46, 2, 0, 0)
    assert (d["n_n"], d["n"], d["longest_n"], d["longest"]) == (1, 2, 1, 1)


def test_time_to_first_token_counts_a_request_aborted_after_it(server):
    """The client hangs up once the first token has streamed: one time to first token, and
    nothing in the histograms of finished requests."""
    assert wait_until(lambda: engine_idle(server), 10)
    before = _read(server)
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                      json={"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 300,
                            "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data:"))
    assert wait_until(lambda: engine_idle(server), 30)
    d = _delta(server, before)
    assert d["ttft_n"] == 1 and d["ttft"] > 0
    assert all(d[key + "_n"] == 0 for key in _HISTOGRAMS if key != "ttft")


def _completion(index: int, tokens: int, finish_reason: str | None, m: RequestMetrics) -> CompletionOutput:
    return CompletionOutput(index=index, text="", token_ids=list(range(tokens)),
                            finish_reason=finish_reason, metrics=m)


def _samples(hist) -> dict[str, float]:
    return {s.name.rsplit("_", 1)[-1]: s.value for family in hist.collect() for s in family.samples
            if not s.name.endswith(("_bucket", "_created"))}


def test_a_completion_that_ended_counts_though_its_sibling_is_aborted():
    """n = 2, 4 prompt tokens. Completion 0 ends ("length") after 3 tokens: arrived and
    queued at 0 s, scheduled at 0.1, first token at 0.3, last at 0.7, finished at 0.7 (by hand: e2e 0.7,
    queue 0.1, prefill 0.2, decode 0.4, inference 0.6, 0.2 s per token after the first). It is
    counted when its end arrives, once, however often later outputs repeat it. Completion 1
    had its first token at 0.4 (time to first token 0.4) and is then aborted: not counted as
    finished, and the request's n and longest completion are not counted either."""
    metrics = ServerMetrics(IdleEngine(), "m", lambda: 0)
    observer = OutputObserver(metrics)
    ended = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.1, first_token_time=0.3,
                           last_token_time=0.7, finished_time=0.7, num_generation_tokens=3,
                           longest_completion_tokens=3, queued_time=0.0)
    running = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.1, first_token_time=0.4,
                             last_token_time=0.8, num_generation_tokens=2, longest_completion_tokens=2)
    whole = RequestMetrics(arrival_time=0.0)
    first = RequestOutput("r", None, [1, 2, 3, 4], [_completion(0, 3, "length", ended),
                                                    _completion(1, 2, None, running)], False, metrics=whole)
    last = RequestOutput("r", None, [1, 2, 3, 4], [_completion(0, 3, "length", ended),
                                                   _completion(1, 2, "abort", running)], True, metrics=whole)
    observer.output_arrived(0, first)
    observer.output_arrived(0, last)
    expected = {metrics.ttft_s: (2, 0.7), metrics.e2e_s: (1, 0.7), metrics.queue_s: (1, 0.1),
                metrics.prefill_s: (1, 0.2), metrics.decode_s: (1, 0.4),
                metrics.inference_s: (1, 0.6), metrics.tpot_s: (1, 0.2),
                metrics.prompt_len: (1, 4), metrics.output_len: (1, 3),
                metrics.params_n: (0, 0), metrics.max_output_len: (0, 0)}
    for hist, (count, total) in expected.items():
        seen = _samples(hist)
        assert (seen["count"], seen["sum"]) == (count, pytest.approx(total)), hist
