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
from inferlab.engine.spec_decode import SpecDecodeCounters

# seconds; log-spaced from what a GPU does to what a loaded CPU does
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0,
                      10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
                  0.75, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
_N_BUCKETS = (1, 2, 5, 10, 20, 50, 100)
_STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REJECT_REASONS = ("queue_full", "shutting_down")  # the codes of a 503, as ServerContext gives them


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model_name: str, in_flight: Callable[[], int]) -> None:
        disable_created_metrics()  # no *_created series beside each histogram, as vLLM serves
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(engine, model_name, in_flight))
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple[float, ...]):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        self.ttft_s = histogram("vllm:time_to_first_token_seconds", "Arrival in the engine to "
                                "the first output token, observed as it arrives.", _LATENCY_BUCKETS_S)
        self.itl_s = histogram("vllm:inter_token_latency_seconds",
                               "Time between two outputs with tokens of one completion (a "
                               "step's kept drafts come as one), as the server receives them.",
                               _ITL_BUCKETS_S)
        self.e2e_s = histogram("vllm:e2e_request_latency_seconds",
                               "Arrival in the engine to the last token.", _LATENCY_BUCKETS_S)
        self.queue_s = histogram("vllm:request_queue_time_seconds",
                                 "Arrival in the engine to first being scheduled.", _LATENCY_BUCKETS_S)
        self.prefill_s = histogram("vllm:request_prefill_time_seconds", "First scheduled to the "
                                   "first token.", _LATENCY_BUCKETS_S)
        self.decode_s = histogram("vllm:request_decode_time_seconds", "First token to the last.",
                                  _LATENCY_BUCKETS_S)
        self.inference_s = histogram("vllm:request_inference_time_seconds", "First scheduled to "
                                     "the last token.", _LATENCY_BUCKETS_S)
        self.tpot_s = histogram("vllm:request_time_per_output_token_seconds", "A request's decode "
                                "time over its output tokens after the first (0 for one token).",
                                _ITL_BUCKETS_S)
        self.params_n = histogram("vllm:request_params_n", "Requests' n.", _N_BUCKETS)
        self.max_output_len = histogram("vllm:request_max_num_generation_tokens", "Output tokens "
                                        "of a request's longest completion.", _TOKEN_BUCKETS)
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt length of finished "
                                    "requests (each of n completions).", _TOKEN_BUCKETS)
        self.output_len = histogram("vllm:request_generation_tokens", "Output tokens of finished "
                                    "requests (each of n completions).", _TOKEN_BUCKETS)
        # per engine step: how many tokens and how long (a prompt chunk's step against a
        # decode-only one is the first thing to look at when latency moves)
        self.step_tokens = histogram("vllm:iteration_tokens_total", "Tokens computed per engine "
                                     "step.", _STEP_TOKEN_BUCKETS)
        self.step_s = histogram("inferlab:engine_step_duration_seconds", "Duration of an engine "
                                "step (schedule, forward, sample, outputs).", _ITL_BUCKETS_S)
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
        name = [self.model_name]

        def gauge(metric: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric(name, value)
            return family

        def counter(metric: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric(name, value)
            return family

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
        success = CounterMetricFamily("vllm:request_success", "Finished sequences by finish "
                                      "reason.", labels=["model_name", "finished_reason"])
        for reason in sorted({"stop", "length", "abort", *s.requests_finished}):
            success.add_metric([self.model_name, reason], s.requests_finished.get(reason, 0))
        yield success
        if s.spec_decode is not None:
            yield from _spec_decode_metrics(s.spec_decode, self.model_name, counter)
        yield gauge("inferlab:kv_cache_blocks", "KV blocks in the cache.", s.scheduler.num_blocks)
        yield gauge("inferlab:kv_cache_free_blocks", "Free KV blocks (evictable cached ones "
                    "included).", s.scheduler.num_free_blocks)
        yield gauge("inferlab:num_requests_in_flight", "Sequences admitted by the server and not "
                    "yet finished.", self.in_flight())
        yield gauge("inferlab:engine_heartbeat_age_seconds", "Time since the engine loop last "
                    "went round.", time.monotonic() - self.engine.heartbeat)


def _spec_decode_metrics(spec: SpecDecodeCounters, model_name: str,
                         counter: Callable[[str, str, float], Metric]) -> Iterator[Metric]:
    """vLLM's speculative decoding series: acceptance rate = accepted / draft tokens, mean
    acceptance length = 1 + accepted / drafts."""
    yield counter("vllm:spec_decode_num_drafts", "Steps in which a request had drafts.", spec.num_drafts)
    yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens)
    yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens kept.", spec.num_accepted_tokens)
    per_position = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens "
                                       "kept, by position in the drafts.", labels=["model_name", "position"])
    for position, count in enumerate(spec.accepted_per_position):
        per_position.add_metric([model_name, str(position)], count)
    yield per_position
