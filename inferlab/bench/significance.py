"""Significance tests behind `bench compare`: is a statistic's change more than noise?

Each gated statistic is tested on that statistic, so a shift confined to the tail is
judged by the tail and a median moving one way cannot lend its p-value to a p95 that
moved the other.

- Median: Mann-Whitney U. Rank-based, so it suits latency distributions (skewed,
  heavy-tailed) where a t-test does not. Normal approximation with tie correction and
  continuity correction, which is accurate for the sample sizes of a benchmark stage
  (tens to thousands); the exact distribution of U where both samples have at most
  EXACT_MAX_N values and no ties (as scipy's "auto" takes it for small samples), where the
  approximation is off (3 against 3, wholly apart: 0.081 against the exact 0.1).
- Other percentiles (p90, p95, ...): a percentile bootstrap of the difference of the two
  samples' percentiles, other - base, each sample resampled on its own. The p-value
  inverts its confidence interval: the smallest alpha at which the central (1 - alpha)
  interval of the resampled differences excludes 0, that is twice the smaller share of
  differences on either side of 0, with the usual +1 correction (Davison & Hinkley,
  Bootstrap Methods, 1997, ch. 4). A fixed seed makes it deterministic. It costs no
  resampling of whole samples: a resample's sorted draws from n values are the order
  statistics of n uniforms scaled by n, and the k-th of those is Beta(k, n + 1 - k)
  distributed, so only the two order statistics numpy's linear interpolation reads are
  drawn, exactly, whatever the sample size.
- A rate of failures: Fisher's exact test on the 2x2 table (failed, not failed) x
  (base, other), two-sided; exact, so a single extra error in a small run is no
  evidence.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000  # p-values resolve to 2e-4: ample for any usual alpha
BOOTSTRAP_SEED = 0
EXACT_MAX_N = 8  # Mann-Whitney's exact p up to this many values a sample (scipy's bound)


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
    if max(n1, n2) <= EXACT_MAX_N and not np.any(ties > 1):
        low_tail = _u_counts(n1, n2)[: round(min(u1, n1 * n2 - u1)) + 1].sum()
        return u1, min(1.0, 2 * float(low_tail) / math.comb(n1 + n2, n1))
    n = n1 + n2
    tie_term = float(np.sum(ties.astype(np.float64) ** 3 - ties)) / (n * (n - 1)) if n > 1 else 0
    variance = n1 * n2 / 12 * ((n + 1) - tie_term)
    if variance <= 0:  # every value equal: no evidence of a difference
        return u1, 1.0
    mean = n1 * n2 / 2
    z = (abs(u1 - mean) - 0.5) / math.sqrt(variance)
    return u1, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


@functools.cache
def _u_counts(n1: int, n2: int) -> np.ndarray:
    """How many of the C(n1 + n2, n1) orderings of two untied samples give each U (0..n1*n2):
    the largest value is the first sample's (beating all n2 of the second) or the second's."""
    if n1 == 0 or n2 == 0:
        return np.ones(1, dtype=np.int64)
    counts = np.zeros(n1 * n2 + 1, dtype=np.int64)
    counts[n2:] += _u_counts(n1 - 1, n2)
    counts[: n1 * (n2 - 1) + 1] += _u_counts(n1, n2 - 1)
    return counts


def resampled_percentiles(values: np.ndarray, percentiles: Sequence[float],
                          rng: np.random.Generator) -> np.ndarray:
    """(BOOTSTRAP_RESAMPLES, len(percentiles)): each percentile (numpy's linear
    interpolation) of each bootstrap resample of `values` (non-empty)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    rank = np.asarray(percentiles, dtype=np.float64) / 100 * (n - 1)
    low = np.floor(rank).astype(np.int64)  # 0-based: the (low + 1)-th smallest
    size = (BOOTSTRAP_RESAMPLES, low.size)
    u_low = rng.beta(low + 1, n - low, size=size)
    # the next order statistic: u_low plus a (1 - u_low) share of the least of the other
    # n - low - 1 uniforms; unused (weight 0) when low is the last rank
    u_high = u_low + (1 - u_low) * rng.beta(1, np.maximum(n - low - 1, 1), size=size)
    j_low = np.minimum((u_low * n).astype(np.int64), n - 1)
    j_high = np.minimum((u_high * n).astype(np.int64), n - 1)
    return x[j_low] + (rank - low) * (x[j_high] - x[j_low])


def percentile_difference_p(a: list[float], b: list[float],
                            percentiles: Sequence[float]) -> list[float]:
    """Two-sided bootstrap p-value that each percentile of `b` differs from `a`'s; NaN
    when a sample is empty."""
    if not a or not b:
        return [math.nan] * len(percentiles)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diff = resampled_percentiles(np.asarray(b), percentiles, rng) - \
        resampled_percentiles(np.asarray(a), percentiles, rng)
    tail = np.minimum((diff <= 0).sum(axis=0), (diff >= 0).sum(axis=0))
    return [min(1.0, 2 * (float(t) + 1) / (BOOTSTRAP_RESAMPLES + 1)) for t in tail]


def fisher_exact(a_events: int, a_total: int, b_events: int, b_total: int) -> float:
    """Two-sided p of Fisher's exact test that two proportions are equal: the summed
    probability, under fixed margins, of every table no likelier than the observed one.
    NaN when a sample is empty."""
    if a_total == 0 or b_total == 0:
        return math.nan
    n, events = a_total + b_total, a_events + b_events
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])

    def log_choose(m: int, k: np.ndarray | int) -> np.ndarray:
        return log_factorial[m] - log_factorial[k] - log_factorial[m - np.asarray(k)]

    k = np.arange(max(0, events - b_total), min(events, a_total) + 1)  # a's possible events
    log_p = log_choose(a_total, k) + log_choose(b_total, events - k) - log_choose(n, events)
    observed = log_p[a_events - k[0]]
    # tolerance: a table as likely as the observed one must not drop out by rounding
    return min(1.0, float(np.exp(log_p[log_p <= observed + 1e-7]).sum()))
