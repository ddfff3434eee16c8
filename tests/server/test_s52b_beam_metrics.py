"""A beam search's rounds in /metrics as vLLM counts them: its beam_search runs every round's
beams through generate(), each an engine request of n = 1 that its output processor records as
any other, in request_success_total and prompt_tokens_total and in every per-request
histogram. They once counted in the totals and in none of the histograms."""

from __future__ import annotations

import httpx
from server_helpers import MODEL_NAME, engine_idle, wait_until

_HISTOGRAMS = ["time_to_first_token_seconds", "e2e_request_latency_seconds",
               "request_queue_time_seconds", "request_prefill_time_seconds",
               "request_decode_time_seconds", "request_inference_time_seconds",
               "request_time_per_output_token_seconds", "request_prompt_tokens",
               "request_generation_tokens", "request_params_n",
               "request_max_num_generation_tokens"]


def _read(server) -> dict[str, float]:
    m = server.metrics()
    label = f'model_name="{MODEL_NAME}"'
    values = {name: m[f"vllm:{name}_count{{{label}}}"] for name in _HISTOGRAMS}
    for name in ("request_prompt_tokens", "request_generation_tokens", "request_params_n"):
        values[name + "_sum"] = m[f"vllm:{name}_sum{{{label}}}"]
    values["success"] = m[f'vllm:request_success_total{{finished_reason="length",{label}}}']
    values["prompt_total"] = m[f"vllm:prompt_tokens_total{{{label}}}"]
    return values


def test_every_round_of_a_beam_search_counts_as_a_request(server):
    """Width 2, 3 tokens, a prompt of P = 7 tokens, no end token taken. Round 1 runs the prompt
    alone, rounds 2 and 3 two beams each: 5 engine requests of one token each ("length"), of
    prompts P, P + 1, P + 1, P + 2, P + 2 (5P + 6 = 41 tokens). Each is one observation in
    every per-request histogram (n = 1 each)."""
    assert wait_until(lambda: engine_idle(server), 10)
    prompt = [2100 + 11 * i for i in range(7)]
    before = _read(server)
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 3, "n": 2,
                         "use_beam_search": True, "ignore_eos": True})
    assert r.status_code == 200, r.text
    d = {key: value - before[key] for key, value in _read(server).items()}
    assert (d["success"], d["prompt_total"]) == (5, 41)
    assert {name: d[name] for name in _HISTOGRAMS} == dict.fromkeys(_HISTOGRAMS, 5)
    assert (d["request_prompt_tokens_sum"], d["request_generation_tokens_sum"],
            d["request_params_n_sum"]) == (41, 5, 5)
