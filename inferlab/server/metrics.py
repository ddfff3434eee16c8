"""/metrics in Prometheus text, under vLLM's metric names so existing dashboards work.

Gauges and totals are read from the engine's stats snapshot at scrape time; the per-request
histograms are observed by the server as outputs arrive, per completion (vLLM runs each of n
completions as a request of its own). Our own series are prefixed `inferlab:`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from inferlab.engine.scheduler import SchedulerStats
from inferlab.engine.spec_decode import SpecDecodeCounters

# vLLM's buckets (vllm/v1/metrics/loggers.py, PrometheusStatLogger), so that a dashboard's
# quantiles read the same from both servers
_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                            5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # inter-token and per output token
_REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                              50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_N_BUCKETS = (1, 2, 5, 10, 20)
_STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# ours: an engine step takes from a millisecond on a GPU to seconds on a loaded CPU
_STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 2.5, 5.0, 10.0)
# vLLM's FINISH_REASON_STRINGS (vllm/v1/engine/__init__.py): each series is there from 0
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
ENGINE_INDEX = "0"  # vLLM labels its series with the engine core's index; one engine here
REJECT_REASONS = ("queue_full", "shutting_down")  # the codes of a 503, as ServerContext gives them


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: vLLM's build_1_2_5_buckets, its buckets of
    token counts (up to max_model_len)."""
    buckets = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


def series_labels(metric: str, model_name: str) -> dict[str, str]:
    """vLLM's series carry the engine's index beside the model name; our own only the name."""
    if metric.startswith("vllm:"):
        return {"model_name": model_name, "engine": ENGINE_INDEX}
    return {"model_name": model_name}


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model_name: str, in_flight: Callable[[], int]) -> None:
        disable_created_metrics()  # no *_created series beside each histogram, as vLLM serves
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(engine, model_name, in_flight))
        tokens = one_two_five_buckets(engine.max_model_len)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]):
            labels = series_labels(name, model_name)
            return Histogram(name, doc, list(labels), buckets=buckets,
                             registry=self.registry).labels(**labels)

        self.ttft_s = histogram("vllm:time_to_first_token_seconds", "Arrival at the server's "
                                "engine (before encoding) to the first output token, observed as "
                                "it arrives.", _TTFT_BUCKETS_S)
        self.itl_s = histogram("vllm:inter_token_latency_seconds",
                               "Time between two outputs with tokens of one completion (a "
                               "step's kept drafts come as one), as the server receives them.",
                               _TOKEN_LATENCY_BUCKETS_S)
        self.e2e_s = histogram("vllm:e2e_request_latency_seconds",
                               "Arrival at the server's engine (before encoding) to the last "
                               "token.", _REQUEST_LATENCY_BUCKETS_S)
        self.queue_s = histogram("vllm:request_queue_time_seconds", "Queued in the "
                                 "scheduler to first being scheduled.", _REQUEST_LATENCY_BUCKETS_S)
        self.prefill_s = histogram("vllm:request_prefill_time_seconds", "First scheduled to the "
                                   "first token.", _REQUEST_LATENCY_BUCKETS_S)
        self.decode_s = histogram("vllm:request_decode_time_seconds", "First token to the last.",
                                  _REQUEST_LATENCY_BUCKETS_S)
        self.inference_s = histogram("vllm:request_inference_time_seconds", "First scheduled to "
                                     "the last token.", _REQUEST_LATENCY_BUCKETS_S)
        self.tpot_s = histogram("vllm:request_time_per_output_token_seconds", "A request's decode "
                                "time over its output tokens after the first (0 for one token).",
                                _TOKEN_LATENCY_BUCKETS_S)
        self.params_n = histogram("vllm:request_params_n", "Requests' n.", _N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens", "Finished requests' "
                                           "max_tokens (each of n completions), fitted to the "
                                           "context.", tokens)
        self.max_output_len = histogram("vllm:request_max_num_generation_tokens", "Output tokens "
                                        "of a request's longest completion.", tokens)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt length of finished "
                                    "requests (each of n completions).", tokens)
        self.output_len = histogram("vllm:request_generation_tokens", "Output tokens of finished "
                                    "requests (each of n completions).", tokens)
        # per engine step: how many tokens and how long (a prompt chunk's step against a
        # decode-only one is the first thing to look at when latency moves)
        self.step_tokens = histogram("vllm:iteration_tokens_total", "Tokens computed per engine "
                                     "step.", _STEP_TOKEN_BUCKETS)
        self.step_s = histogram("inferlab:engine_step_duration_seconds", "Duration of an engine "
                                "step (schedule, forward, sample, outputs).", _STEP_BUCKETS_S)
        engine.observe_steps(self._observe_step)
        self._rejected = Counter("inferlab:requests_rejected", "Requests refused with 503, by "
                                 "reason.", ["model_name", "reason"], registry=self.registry)
        for reason in REJECT_REASONS:  # each series from 0, so rate() and alerts see the first
            self._rejected.labels(model_name, reason)
        self._model_name = model_name

    def observe_completion(self, m: RequestMetrics, num_prompt_tokens: int,
                           num_output_tokens: int) -> None:
        """A completion that ran to its end: vLLM's finished (child) request."""
        tpot = m.mean_tpot_s
        if tpot is None and m.decode_time_s is not None:
            tpot = 0.0  # one token, no time after it to share out: vLLM observes 0
        for hist, value in ((self.e2e_s, m.e2e_latency_s), (self.queue_s, m.queue_time_s),
                            (self.prefill_s, m.prefill_time_s), (self.decode_s, m.decode_time_s),
                            (self.inference_s, m.inference_time_s), (self.tpot_s, tpot)):
            if value is not None:
                hist.observe(value)
        self.prompt_len.observe(num_prompt_tokens)
        self.output_len.observe(num_output_tokens)
        if m.max_tokens is not None:  # None: timings made up without a request (tests)
            self.params_max_tokens.observe(m.max_tokens)

    def observe_request(self, out: RequestOutput) -> None:
        """A request whose n completions all ran to their end: vLLM's parent request, counted
        once its last child has finished."""
        self.params_n.observe(len(out.outputs))
        self.max_output_len.observe(max(len(c.token_ids) for c in out.outputs))

    def _observe_step(self, seconds: float, tokens: int) -> None:
        self.step_s.observe(seconds)
        self.step_tokens.observe(tokens)

    def reject(self, reason: str) -> None:
        self._rejected.labels(self._model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


_Key = tuple[int, int]  # (prompt index, completion index)


class OutputObserver:
    """One API request's outputs, recorded per completion as vLLM records its requests: the
    time to the first token as that token arrives, whatever becomes of the request later; the
    gaps between tokens; the latencies and lengths as the completion ends, unless it was
    aborted (vLLM drops an aborted request's state unrecorded)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self._last_s: dict[_Key, float] = {}
        self._started: set[_Key] = set()
        self._ended: set[_Key] = set()  # every output lists every completion, ended ones too

    def output_arrived(self, index: int, out: RequestOutput) -> None:
        """The output of prompt `index`."""
        for completion in out.outputs:
            key = (index, completion.index)
            self._tokens_arrived(key, len(completion.token_ids_delta))
            # None: a beam search's best beams, no engine request (its rounds' are observed apart)
            if completion.metrics is not None:
                self._observe_times(key, completion.metrics, completion, len(out.prompt_token_ids))
        # the parent counts when its last child finishes; vLLM records no aborted child's finish
        if out.finished and out.metrics is not None and all(
                c.finish_reason != "abort" for c in out.outputs):
            self.metrics.observe_request(out)

    def _observe_times(self, key: _Key, m: RequestMetrics, completion: CompletionOutput,
                       num_prompt_tokens: int) -> None:
        if m.ttft_s is not None and key not in self._started:
            self._started.add(key)
            self.metrics.ttft_s.observe(m.ttft_s)
        if completion.finished and key not in self._ended:
            self._ended.add(key)
            if completion.finish_reason != "abort":
                self.metrics.observe_completion(m, num_prompt_tokens, len(completion.token_ids))

    def _tokens_arrived(self, key: _Key, num_tokens: int) -> None:
        """The time since the completion's previous tokens reached the server: one gap an
        output, however many tokens it brings (drafts kept), as vLLM observes one an engine
        output; the gaps sum to the time from the first token to the last."""
        if num_tokens == 0:
            return
        now = time.monotonic()
        last = self._last_s.get(key)
        if last is not None:
            self.metrics.itl_s.observe(now - last)
        self._last_s[key] = now


class _EngineCollector(Collector):
    def __init__(self, engine: AsyncEngine, model_name: str, in_flight: Callable[[], int]) -> None:
        self.engine = engine
        self.model_name = model_name
        self.in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()

        def gauge(metric: str, doc: str, value: float) -> Metric:
            return _family(GaugeMetricFamily, metric, doc, self.model_name, [({}, value)])

        def counter(metric: str, doc: str, value: float) -> Metric:
            return _family(CounterMetricFamily, metric, doc, self.model_name, [({}, value)])

        yield gauge("vllm:num_requests_running", "Sequences holding KV blocks.", s.scheduler.num_running)
        yield gauge("vllm:num_requests_waiting", "Sequences waiting to be scheduled (preempted "
                    "ones included).", s.scheduler.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).",
                    s.scheduler.kv_cache_usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s.scheduler.prefix_cache_queried_tokens)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens served by the prefix cache.",
                      s.scheduler.prefix_cache_hit_tokens)
        yield counter("vllm:num_preemptions", "Preemptions.", s.scheduler.num_preemptions_total)
        yield counter("vllm:prompt_tokens", "Prompt tokens prefilled.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Tokens generated.", s.generation_tokens_total)
        reasons = dict.fromkeys([*FINISH_REASONS, *s.requests_finished])
        yield _family(CounterMetricFamily, "vllm:request_success", "Finished sequences by finish "
                      "reason.", self.model_name,
                      [({"finished_reason": r}, s.requests_finished.get(r, 0)) for r in reasons])
        if s.spec_decode is not None:
            yield from _spec_decode_metrics(s.spec_decode, self.model_name, counter)
        yield _cache_config_info(s.scheduler)
        yield gauge("inferlab:kv_cache_blocks", "KV blocks in the cache.", s.scheduler.num_blocks)
        yield gauge("inferlab:kv_cache_free_blocks", "Free KV blocks (evictable cached ones "
                    "included).", s.scheduler.num_free_blocks)
        yield gauge("inferlab:num_requests_in_flight", "Sequences admitted by the server and not "
                    "yet finished.", self.in_flight())
        yield gauge("inferlab:engine_heartbeat_age_seconds", "Time since the engine loop last "
                    "went round.", time.monotonic() - self.engine.heartbeat)


def _family(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], metric: str, doc: str,
            model_name: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    """A series per sample: the metric's labels and the sample's own (a finish reason, a
    position), each sample labelled alike."""
    labels = series_labels(metric, model_name)
    family = kind(metric, doc, labels=[*labels, *(samples[0][0] if samples else {})])
    for own, value in samples:
        family.add_metric([*labels.values(), *own.values()], value)
    return family


def _cache_config_info(scheduler: SchedulerStats) -> Metric:
    """vLLM's vllm:cache_config_info, an info gauge at 1: those of its CacheConfig's fields
    ours has, its names, Python's str() of the values as vLLM writes them; no model name."""
    info = {"block_size": str(scheduler.block_size),
            "enable_prefix_caching": str(scheduler.enable_prefix_caching),
            "engine": ENGINE_INDEX, "num_gpu_blocks": str(scheduler.num_blocks)}
    family = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine "
                               "CacheConfig", labels=list(info))
    family.add_metric(list(info.values()), 1)
    return family


def _spec_decode_metrics(spec: SpecDecodeCounters, model_name: str,
                         counter: Callable[[str, str, float], Metric]) -> Iterator[Metric]:
    """vLLM's speculative decoding series: acceptance rate = accepted / draft tokens, mean
    acceptance length = 1 + accepted / drafts."""
    yield counter("vllm:spec_decode_num_drafts", "Steps in which a request had drafts.", spec.num_drafts)
    yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens)
    yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens kept.", spec.num_accepted_tokens)
    yield _family(CounterMetricFamily, "vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens "
                  "kept, by position in the drafts.", model_name,
                  [({"position": str(p)}, count) for p, count in enumerate(spec.accepted_per_position)])
