"""Per-request metrics, with the definitions the report prints beside them."""

from __future__ import annotations

from collections.abc import Callable

from inferlab.bench.records import RequestRecord

NS_PER_MS = 1e6

# name -> definition, in the order the report shows them
DEFINITIONS = {
    "ttft_ms": "time to first token: first chunk carrying generated text - request start "
               "(the moment the client began sending)",
    "ttft_intended_ms": "time to first token measured from the intended send time, so "
                        "queueing inside the client (coordinated omission) cannot hide",
    "itl_ms": "inter-token latency: (last token - first token) / (output tokens - 1); "
              "requests with at least 2 output tokens",
    "tpot_ms": "time per output token: (end - start) / output tokens",
    "e2e_ms": "end-to-end latency: last byte of the response - request start",
    "e2e_intended_ms": "end-to-end latency from the intended send time",
    "dispatch_lag_ms": "request start - intended send time (how late the client sent)",
    "itl_token_ms": "per-token inter-token latency: each gap between text chunks divided by "
                    "the tokens of the later chunk, one sample per token",
    "chunk_gap_ms": "time between consecutive chunks carrying text, one sample per gap",
    "prompt_tokens": "prompt tokens, from the server's usage (the client's estimate if none)",
    "output_tokens": "output tokens, from the server's usage (counted chunks if none)",
}
THROUGHPUT_DEFINITIONS = {
    "request_throughput": "successful requests ending in the window, whenever they started, "
                          "/ window length (req/s)",
    "output_token_throughput": "output tokens of successful requests that arrived in the "
                               "window, whenever their request started, / window length "
                               "(tok/s)",
    "total_token_throughput": "prompt tokens of successful requests whose first token "
                              "arrived in the window, plus output tokens, / window length",
    "goodput": "successful requests ending in the window that met every --slo bound "
               "(ttft and e2e from the intended send time; tpot as itl_ms, after the "
               "first token) / window length (req/s)",
    "slo_fraction": "requests started in the window that succeeded and met every --slo bound "
                    "/ requests started in the window",
    "sent_rate": "achieved send rate of a rate stage (constant, poisson; req/s): 1 / the "
                 "least-squares slope of the sorted start times against their rank",
    "scheduled_rate": "the same requests' rate by their intended send times (a poisson "
                      "schedule's own rate differs from the asked mean)",
    "concurrency": "requests in flight, averaged over time",
}


def _ms(ns: int | float) -> float:
    return ns / NS_PER_MS


def ttft_ms(r: RequestRecord) -> float | None:
    if r.first_token_ns is None or r.start_ns is None:
        return None
    return _ms(r.first_token_ns - r.start_ns)


def ttft_intended_ms(r: RequestRecord) -> float | None:
    return None if r.first_token_ns is None else _ms(r.first_token_ns - r.intended_ns)


def itl_ms(r: RequestRecord) -> float | None:
    if r.output_tokens < 2 or len(r.chunk_ns) < 2:
        return None
    return _ms(r.chunk_ns[-1] - r.chunk_ns[0]) / (r.output_tokens - 1)


def tpot_ms(r: RequestRecord) -> float | None:
    if r.output_tokens < 1 or r.end_ns is None or r.start_ns is None:
        return None
    return _ms(r.end_ns - r.start_ns) / r.output_tokens


def e2e_ms(r: RequestRecord) -> float | None:
    if r.end_ns is None or r.start_ns is None:
        return None
    return _ms(r.end_ns - r.start_ns)


def e2e_intended_ms(r: RequestRecord) -> float | None:
    return None if r.end_ns is None else _ms(r.end_ns - r.intended_ns)


def dispatch_lag_ms(r: RequestRecord) -> float | None:
    return None if r.start_ns is None else _ms(r.start_ns - r.intended_ns)


def prompt_tokens(r: RequestRecord) -> float | None:
    return float(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_sent)


def output_tokens(r: RequestRecord) -> float | None:
    return float(r.output_tokens) if r.start_ns is not None else None


PER_REQUEST: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft_ms": ttft_ms, "ttft_intended_ms": ttft_intended_ms, "itl_ms": itl_ms,
    "tpot_ms": tpot_ms, "e2e_ms": e2e_ms, "e2e_intended_ms": e2e_intended_ms,
    "dispatch_lag_ms": dispatch_lag_ms, "prompt_tokens": prompt_tokens,
    "output_tokens": output_tokens,
}


def itl_token_samples_ms(r: RequestRecord) -> list[float]:
    samples: list[float] = []
    for prev, cur, tokens in zip(r.chunk_ns, r.chunk_ns[1:], r.chunk_tokens[1:], strict=False):
        if tokens > 0:
            samples.extend([_ms(cur - prev) / tokens] * tokens)
    return samples


def chunk_gap_samples_ms(r: RequestRecord) -> list[float]:
    return [_ms(b - a) for a, b in zip(r.chunk_ns, r.chunk_ns[1:], strict=False)]


PER_SAMPLE: dict[str, Callable[[RequestRecord], list[float]]] = {
    "itl_token_ms": itl_token_samples_ms, "chunk_gap_ms": chunk_gap_samples_ms,
}
# a TPOT bound is on the time per output token after the first, as vLLM's `--goodput tpot:`
# ((e2e - ttft) / (output tokens - 1)) and guidellm's GoodputSLO.tpot_ms (its inter-token
# latency) read it: that is itl_ms, not tpot_ms above, which counts the first token's wait
SLO_SOURCES = {"ttft_ms": ttft_intended_ms, "itl_ms": itl_ms, "tpot_ms": itl_ms,
               "e2e_ms": e2e_intended_ms}


def meets_slo(r: RequestRecord, bounds: dict[str, float]) -> bool:
    """A successful request whose every bounded latency is within its bound."""
    if r.outcome != "ok":
        return False
    for name, bound in bounds.items():
        value = SLO_SOURCES[name](r)
        if value is not None and value > bound:
            return False
    return True
