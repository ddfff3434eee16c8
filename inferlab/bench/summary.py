"""Aggregate one stage's request records into the numbers the report shows."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from inferlab.bench.config import NS_PER_S, Span
from inferlab.bench.metrics import PER_REQUEST, PER_SAMPLE, SLO_SOURCES, meets_slo, prompt_tokens
from inferlab.bench.profiles import RATE_KINDS
from inferlab.bench.records import OUTCOMES, RequestRecord, ended_by_itself
from inferlab.bench.stats import Distribution


@dataclass
class StageInfo:
    """What the runner knows about a stage besides its records."""

    stage: int
    label: str
    kind: str
    rate: float | None  # asked: req/s (constant, poisson) or streams (concurrent)
    start_ns: int  # scheduled start, ns since the run's epoch
    stop_reason: str  # why it ended: max_seconds, max_requests, max_error_rate, interrupted
    scheduled: int  # requests it meant to send (rate stages), or sent (closed loops)


@dataclass
class StageSummary:
    info: StageInfo
    end_ns: int  # the last request's end, cut ones included
    # counts, send rates and latencies cover requests started in [window_start, window_end];
    # throughputs, what was delivered in it. The window ends at the last send or the last
    # end of a request not cut by the benchmark (see _active_end_ns), less any cooldown
    window_start_ns: int
    window_end_ns: int
    counts: dict[str, int]  # requests in the window by outcome
    sent_rate: float | None  # achieved send rate, req/s
    scheduled_rate: float | None  # the same requests' rate by their intended send times
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    goodput: float | None  # None without --slo
    slo_fraction: float | None  # fraction of measured requests meeting the SLO
    concurrency_mean: float
    concurrency_max: int
    metrics: dict[str, dict[str, Distribution]]  # metric -> outcome -> distribution
    warnings: list[str] = field(default_factory=list)
    # requests left out by count, the first and the last sent, besides the window: a
    # fractional warmup and cooldown where --max-requests alone bounds the stage
    warmup_requests: int = 0
    cooldown_requests: int = 0

    @property
    def window_s(self) -> float:
        return max(0.0, (self.window_end_ns - self.window_start_ns) / NS_PER_S)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["metrics"] = {m: {o: d.to_dict() for o, d in per.items()}
                           for m, per in self.metrics.items()}
        data["window_s"] = self.window_s
        return data

    @classmethod
    def from_dict(cls, data: dict) -> StageSummary:
        data = dict(data)
        data.pop("window_s", None)
        data["info"] = StageInfo(**data["info"])
        data["metrics"] = {m: {o: Distribution.from_dict(d) for o, d in per.items()}
                           for m, per in data["metrics"].items()}
        return cls(**data)


def summarize(info: StageInfo, records: list[RequestRecord], warmup: Span, cooldown: Span,
              slo: dict[str, float] | None, requests_bound: int | None = None) -> StageSummary:
    """`requests_bound`: the stage's --max-requests where it alone bounds the stage; a
    fractional warmup or cooldown then counts requests (Span.resolve)."""
    end_ns = max((r.end_ns for r in records if r.end_ns is not None), default=info.start_ns)
    active_end_ns = _active_end_ns(info, records)
    w0, w1, skip_first, skip_last = _window(info, records, active_end_ns, warmup, cooldown,
                                            requests_bound)
    measured = _measured(records, w0, w1, skip_first, skip_last)
    warnings = []
    if not any(ended_by_itself(r) for r in records):
        # not the warmup's doing: with nothing finished the stage spans no time
        warnings.append("no request finished in the stage: it has no statistics")
    elif w1 <= w0 or not measured:
        warnings.append("warmup + cooldown leave no request measured; statistics use the "
                        "whole stage")
    if w1 <= w0 or not measured:
        w0, w1, skip_first, skip_last = info.start_ns, active_end_ns, 0, 0
        measured = _measured(records, w0, w1)
    window_s = max((w1 - w0) / NS_PER_S, 1e-9)
    # throughputs count what the server delivered inside the window, whenever the request
    # began: a closed loop's requests started in the warmup end in the window
    ok = [r for r in records if r.outcome == "ok"]
    output_tokens = _tokens_in(ok, w0, w1)
    sent, scheduled = [r for r in measured if r.start_ns is not None], info.kind in RATE_KINDS
    summary = StageSummary(
        info=info, end_ns=end_ns, window_start_ns=w0, window_end_ns=w1,
        counts={o: sum(r.outcome == o for r in measured) for o in OUTCOMES},
        # a rate stage's only: a closed loop's streams start together, and 4 starts within
        # 0.2 ms once read as 21,694 req/s
        sent_rate=_rate([r.start_ns for r in sent]) if scheduled else None,
        scheduled_rate=_rate([r.intended_ns for r in sent]) if scheduled else None,
        request_throughput=_ended_in(ok, w0, w1) / window_s,
        output_token_throughput=output_tokens / window_s,
        total_token_throughput=(output_tokens + _prompt_tokens_in(ok, w0, w1)) / window_s,
        goodput=None, slo_fraction=None,
        concurrency_mean=_concurrency_mean(records, w0, w1),
        concurrency_max=_concurrency_max(records),
        metrics=_distributions(measured), warnings=warnings,
        warmup_requests=skip_first, cooldown_requests=skip_last)
    if slo:
        summary.goodput = _ended_in([r for r in ok if meets_slo(r, slo)], w0, w1) / window_s
        good = sum(meets_slo(r, slo) for r in measured)
        summary.slo_fraction = good / len(measured) if measured else None
    return summary


def _window(info: StageInfo, records: list[RequestRecord], active_end_ns: int, warmup: Span,
            cooldown: Span, requests_bound: int | None) -> tuple[int, int, int, int]:
    """The measured window [w0, w1] and the requests left out by count at either end.
    Counted out, the window opens at the first measured request's send and closes when the
    last measured one is over, so the throughputs cover the time those requests ran."""
    duration_s = (active_end_ns - info.start_ns) / NS_PER_S
    warm_s, skip_first = warmup.resolve(duration_s, requests_bound)
    cool_s, skip_last = cooldown.resolve(duration_s, requests_bound)
    w0 = info.start_ns + round(warm_s * NS_PER_S)
    w1 = active_end_ns - round(cool_s * NS_PER_S)
    kept = _by_send(records)[skip_first:max(0, len(records) - skip_last)]
    if kept and skip_first:
        w0 = max(w0, started_ns(kept[0]))
    if kept and skip_last:
        w1 = min(w1, _active_end_ns(info, kept))
    return w0, w1, skip_first, skip_last


def _by_send(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: (started_ns(r), r.index))


def _measured(records: list[RequestRecord], w0: int, w1: int, skip_first: int = 0,
              skip_last: int = 0) -> list[RequestRecord]:
    """Requests begun in [w0, w1], less the first `skip_first` and last `skip_last` sent;
    in the records' own order."""
    ranked = _by_send(records) if skip_first or skip_last else []
    out = {id(r) for r in ranked[:skip_first] + ranked[max(0, len(ranked) - skip_last):]}
    return [r for r in records if id(r) not in out and w0 <= started_ns(r) <= w1]


def _active_end_ns(info: StageInfo, records: list[RequestRecord]) -> int:
    """Where a stage's window ends: its last send (or scheduled send) or the last end of a
    request that ended by itself. Not where the benchmark cut requests (the drain's end, a
    --request-timeout): throughputs would be divided by time the benchmark chose. A stage
    whose requests were all cut ends at its last send."""
    ends = [r.end_ns for r in records if ended_by_itself(r)]
    return max([*ends, *map(started_ns, records)], default=info.start_ns)


def started_ns(r: RequestRecord) -> int:
    """When a request counts as begun: its start, or its intended time if never sent."""
    return r.start_ns if r.start_ns is not None else r.intended_ns


def measured(summary: StageSummary, records: list[RequestRecord]) -> list[RequestRecord]:
    """The requests a stage's latency statistics cover: those begun inside its window, less
    those its warmup and cooldown left out by count."""
    return _measured(records, summary.window_start_ns, summary.window_end_ns,
                     summary.warmup_requests, summary.cooldown_requests)


def ok_values(summary: StageSummary, records: list[RequestRecord],
              metric: Callable[[RequestRecord], float | None]) -> list[float]:
    """A per-request metric over the successful requests the stage's statistics cover."""
    return [v for r in measured(summary, records) if r.outcome == "ok" and (v := metric(r)) is not None]


def _rate(times_ns: list[int]) -> float | None:
    """Events per second, fitted to all their times: the least-squares slope of the
    sorted times against their rank, so one late event at either end cannot skew it
    the way (n - 1) / (last - first) would."""
    if len(times_ns) < 2 or max(times_ns) == min(times_ns):
        return None
    t = np.sort(np.asarray(times_ns, dtype=np.float64)) / NS_PER_S
    k = np.arange(t.size, dtype=np.float64)
    slope_s = float(np.sum((k - k.mean()) * (t - t.mean())) / np.sum((k - k.mean()) ** 2))
    return 1.0 / slope_s if slope_s > 0 else None


def _ended_in(records: list[RequestRecord], w0: int, w1: int) -> int:
    return sum(r.end_ns is not None and w0 <= r.end_ns <= w1 for r in records)


def _tokens_in(records: list[RequestRecord], w0: int, w1: int) -> int:
    return sum(tokens for r in records for t, tokens in zip(r.chunk_ns, r.chunk_tokens,
                                                             strict=False) if w0 <= t <= w1)


def _prompt_tokens_in(records: list[RequestRecord], w0: int, w1: int) -> int:
    return int(sum(prompt_tokens(r) for r in records
                   if r.first_token_ns is not None and w0 <= r.first_token_ns <= w1))


def _distributions(records: list[RequestRecord]) -> dict[str, dict[str, Distribution]]:
    out: dict[str, dict[str, Distribution]] = {}
    for name, fn in PER_REQUEST.items():
        out[name] = {o: Distribution.of([v for r in records if r.outcome == o
                                         and (v := fn(r)) is not None]) for o in OUTCOMES}
    for name, sample_fn in PER_SAMPLE.items():
        out[name] = {o: Distribution.of([v for r in records if r.outcome == o
                                         for v in sample_fn(r)]) for o in OUTCOMES}
    return out


def intervals(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """The sorted start and end times of the requests that ran, for busy_integral."""
    pairs = [(r.start_ns, r.end_ns) for r in records
             if r.start_ns is not None and r.end_ns is not None]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    starts, ends = np.array(pairs, dtype=np.float64).T
    return np.sort(starts), np.sort(ends)


def busy_integral(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Integral over [-inf, t] of the number of requests in flight (request-seconds * 1e9)."""
    def ramp(points: np.ndarray) -> np.ndarray:
        k = np.searchsorted(points, t, side="right")
        csum = np.concatenate([[0.0], np.cumsum(points)])
        return k * t - csum[k]

    return ramp(starts) - ramp(ends)


def _concurrency_mean(records: list[RequestRecord], w0: int, w1: int) -> float:
    starts, ends = intervals(records)
    if starts.size == 0 or w1 <= w0:
        return 0.0
    area = busy_integral(starts, ends, np.array([w0, w1], dtype=np.float64))
    return float((area[1] - area[0]) / (w1 - w0))


def _concurrency_max(records: list[RequestRecord]) -> int:
    events = sorted([(r.start_ns, 1) for r in records if r.start_ns is not None and r.end_ns]
                    + [(r.end_ns, -1) for r in records if r.start_ns is not None and r.end_ns])
    level = peak = 0
    for _, step in events:  # at equal times ends (-1) sort first: back-to-back is not overlap
        level += step
        peak = max(peak, level)
    return peak


def slo_percentile_check(records: list[RequestRecord], bounds: dict[str, float],
                         percentile: float = 95.0) -> tuple[bool, dict[str, float]]:
    """Does the p-th percentile of each bounded latency meet its bound?

    Failed, cancelled and never-sent requests count as infinitely slow, so a stage
    cannot pass by dropping the requests it could not serve in time.
    """
    observed: dict[str, float] = {}
    for name in bounds:
        values = []
        for r in records:
            value = SLO_SOURCES[name](r) if r.outcome == "ok" else math.inf
            if value is not None:
                values.append(value)
        observed[name] = _percentile_inf(values, percentile)
    return all(observed[n] <= b for n, b in bounds.items()), observed


def _percentile_inf(values: list[float], percentile: float) -> float:
    if not values:
        return math.inf
    ordered = sorted(values)
    rank = percentile / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    a, b = ordered[low], ordered[high]
    if math.isinf(b) and high != low:
        return math.inf
    if math.isinf(a):
        return math.inf
    return a + (b - a) * (rank - low)
