"""Mann-Whitney U test: do two samples of request latencies differ?

Rank-based, so it suits latency distributions (skewed, heavy-tailed) where a t-test
does not. Normal approximation with tie correction and continuity correction, which
is accurate for the sample sizes of a benchmark stage (tens to thousands).
"""

from __future__ import annotations

import math

import numpy as np


def average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n with ties given their average rank, and the size of each tie group."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # boundaries of runs of equal values in the sorted order
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.concatenate([starts[1:], [ordered.size]])
    ranks_sorted = np.empty(ordered.size, dtype=np.float64)
    for s, e in zip(starts, ends, strict=True):
        ranks_sorted[s:e] = (s + 1 + e) / 2  # mean of ranks s+1 .. e
    ranks = np.empty_like(ranks_sorted)
    ranks[order] = ranks_sorted
    return ranks, (ends - starts)


def mann_whitney_u(a: list[float], b: list[float]) -> tuple[float, float]:
    """(U statistic of `a`, two-sided p-value); p is NaN when a sample is empty."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0:
        return math.nan, math.nan
    ranks, ties = average_ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    n = n1 + n2
    tie_term = float(np.sum(ties.astype(np.float64) ** 3 - ties)) / (n * (n - 1)) if n > 1 else 0
    variance = n1 * n2 / 12 * ((n + 1) - tie_term)
    if variance <= 0:  # every value equal: no evidence of a difference
        return u1, 1.0
    mean = n1 * n2 / 2
    z = (abs(u1 - mean) - 0.5) / math.sqrt(variance)
    return u1, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
