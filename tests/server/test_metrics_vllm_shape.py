"""/metrics in vLLM V1's shape, so a dashboard or alert written for vLLM reads ours unchanged.

The reference is vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py): every vllm:* series
is labelled model_name and engine (the engine core's index, "0" for one engine); the histograms'
buckets are the lists written out there, the token counts' build_1_2_5_buckets(max_model_len);
request_success has a series from 0 for each FinishReason (FINISH_REASON_STRINGS in
vllm/v1/engine/__init__.py); request_params_max_tokens observes a finished request's max_tokens;
cache_config_info is an info gauge at 1 labelled with the CacheConfig's fields and the engine.
Before this, the series had no engine label, request_params_max_tokens was missing, the buckets
were our own, only stop/length/abort were there from 0, and cache_config_info was missing."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import MAX_MODEL_LEN, MODEL_NAME, IdleEngine, engine_idle, wait_until

from inferlab.engine.outputs import RequestMetrics
from inferlab.server.metrics import ServerMetrics

# copied by hand from vllm/v1/metrics/loggers.py (PrometheusStatLogger.__init__)
_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
         20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_PER_TOKEN = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
              20.0, 40.0, 80.0]
_REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_ITERATION_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# build_1_2_5_buckets(512), worked out by hand: 1, 2, 5 times 1, 10, 100 while <= 512
_TOKENS_512 = [1, 2, 5, 10, 20, 50, 100, 200, 500]
_BUCKETS = {
    "vllm:time_to_first_token_seconds": _TTFT,
    "vllm:inter_token_latency_seconds": _PER_TOKEN,
    "vllm:request_time_per_output_token_seconds": _PER_TOKEN,
    "vllm:e2e_request_latency_seconds": _REQUEST_LATENCY,
    "vllm:request_queue_time_seconds": _REQUEST_LATENCY,
    "vllm:request_prefill_time_seconds": _REQUEST_LATENCY,
    "vllm:request_decode_time_seconds": _REQUEST_LATENCY,
    "vllm:request_inference_time_seconds": _REQUEST_LATENCY,
    "vllm:request_prompt_tokens": _TOKENS_512,
    "vllm:request_generation_tokens": _TOKENS_512,
    "vllm:request_max_num_generation_tokens": _TOKENS_512,
    "vllm:request_params_max_tokens": _TOKENS_512,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:iteration_tokens_total": _ITERATION_TOKENS,
}


def _families(metrics: ServerMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


@pytest.fixture
def metrics() -> ServerMetrics:
    assert MAX_MODEL_LEN == 512  # _TOKENS_512
    return ServerMetrics(IdleEngine(), "m", lambda: 0)  # type: ignore[arg-type]


def test_every_vllm_series_is_labelled_with_the_model_and_engine_0(metrics):
    extra = {"vllm:request_success": {"finished_reason"}}
    seen = 0
    for name, family in _families(metrics).items():
        if not name.startswith("vllm:") or name == "vllm:cache_config_info":
            continue
        for sample in family.samples:
            own = extra.get(name, set()) | ({"le"} if sample.name.endswith("_bucket") else set())
            assert set(sample.labels) == {"model_name", "engine"} | own, sample
            assert (sample.labels["model_name"], sample.labels["engine"]) == ("m", "0"), sample
            seen += 1
    assert seen > 100  # the histograms' buckets among them
    for name in ("inferlab:kv_cache_blocks", "inferlab:engine_step_duration_seconds"):  # our own
        for sample in _families(metrics)[name].samples:
            assert set(sample.labels) - {"le"} == {"model_name"}, sample


def test_histogram_buckets_are_vllms(metrics):
    families = _families(metrics)
    for name, buckets in _BUCKETS.items():
        bounds = [float(s.labels["le"]) for s in families[name].samples if s.name.endswith("_bucket")]
        assert bounds == [*map(float, buckets), float("inf")], name


def test_request_success_has_every_finish_reason_from_0(metrics):
    success = {s.labels["finished_reason"]: s.value for s in _families(metrics)["vllm:request_success"].samples}
    assert success == {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}


def test_cache_config_info_names_the_block_pool(metrics):
    """IDLE_STATS: one block of 16 tokens, prefix caching on; vLLM writes str() of each value."""
    [sample] = _families(metrics)["vllm:cache_config_info"].samples
    assert sample.labels == {"block_size": "16", "enable_prefix_caching": "True", "engine": "0",
                             "num_gpu_blocks": "1"}
    assert sample.value == 1


def test_request_params_max_tokens_observes_a_finished_completion(metrics):
    """One completion of max_tokens 7: count 1, sum 7, in the bucket le=10 and not le=5."""
    m = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.1, first_token_time=0.2,
                       last_token_time=0.3, finished_time=0.3, num_generation_tokens=2,
                       longest_completion_tokens=2, max_tokens=7)
    metrics.observe_completion(m, num_prompt_tokens=4, num_output_tokens=2)
    samples = _families(metrics)["vllm:request_params_max_tokens"].samples
    values = {(s.name, s.labels.get("le")): s.value for s in samples}
    assert values[("vllm:request_params_max_tokens_count", None)] == 1
    assert values[("vllm:request_params_max_tokens_sum", None)] == 7
    assert values[("vllm:request_params_max_tokens_bucket", "5.0")] == 0
    assert values[("vllm:request_params_max_tokens_bucket", "10.0")] == 1


def test_request_params_max_tokens_counts_each_of_n_completions(server):
    """n = 2, max_tokens 5: two observations of 5, as vLLM observes each child request's."""
    assert wait_until(lambda: engine_idle(server), 10)
    label = f'{{engine="0",model_name="{MODEL_NAME}"}}'

    def read() -> tuple[float, float]:
        m = server.metrics()
        return (m[f"vllm:request_params_max_tokens_count{label}"],
                m[f"vllm:request_params_max_tokens_sum{label}"])

    before = read()
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, "prompt": [3100 + i for i in range(9)], "max_tokens": 5,
                         "n": 2, "temperature": 1.0, "seed": 3, "ignore_eos": True})
    assert r.status_code == 200, r.text
    after = read()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 10)
