"""Throughput and concurrency over the whole run, in fixed time bins."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from inferlab.bench.config import NS_PER_S
from inferlab.bench.records import RequestRecord
from inferlab.bench.summary import busy_integral, intervals

MAX_BINS = 150
MIN_BIN_S = 0.1


@dataclass
class Timeline:
    bin_s: float
    t_s: list[float]  # each bin's start, seconds since the run's epoch
    output_tokens_per_s: list[float]  # tokens of every outcome that arrived in the bin
    completed_per_s: list[float]  # successful requests ending in the bin
    errors_per_s: list[float]  # failed requests ending in the bin
    concurrency: list[float]  # requests in flight, time-averaged over the bin

    def to_dict(self) -> dict:
        return asdict(self)


def build_timeline(records: list[RequestRecord], end_ns: int) -> Timeline:
    duration_s = max(end_ns / NS_PER_S, MIN_BIN_S)
    bin_s = max(MIN_BIN_S, duration_s / MAX_BINS)
    bin_ns = round(bin_s * NS_PER_S)
    bins = -(-end_ns // bin_ns) if end_ns > 0 else 1  # ceiling, in exact integers
    edges_ns = (np.arange(bins + 1, dtype=np.int64) * bin_ns).astype(np.float64)
    token_times = np.array([t for r in records for t in r.chunk_ns], dtype=np.float64)
    token_counts = np.array([k for r in records for k in r.chunk_tokens[:len(r.chunk_ns)]],
                            dtype=np.float64)
    tokens, _ = np.histogram(token_times, bins=edges_ns, weights=token_counts)
    ok_ends = [r.end_ns for r in records if r.outcome == "ok" and r.end_ns is not None]
    err_ends = [r.end_ns for r in records if r.outcome == "error" and r.end_ns is not None]
    completed, _ = np.histogram(np.array(ok_ends, dtype=np.float64), bins=edges_ns)
    errors, _ = np.histogram(np.array(err_ends, dtype=np.float64), bins=edges_ns)
    starts, ends = intervals(records)
    concurrency = np.diff(busy_integral(starts, ends, edges_ns)) / (bin_s * NS_PER_S)
    return Timeline(bin_s=bin_s, t_s=[float(x) for x in edges_ns[:-1] / NS_PER_S],
                    output_tokens_per_s=[float(x) for x in tokens / bin_s],
                    completed_per_s=[float(x) for x in completed / bin_s],
                    errors_per_s=[float(x) for x in errors / bin_s],
                    concurrency=[float(x) for x in concurrency])
