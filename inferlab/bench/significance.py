"""Significance tests behind `bench compare`: is a statistic's change more than noise?

Each gated statistic is tested on that statistic, so a shift confined to the tail is
judged by the tail, a median moving one way cannot lend its p-value to a p95 that moved
the other, and a sample that tends to be smaller overall cannot make its median's rise
significant (a rank test such as Mann-Whitney, which tests that tendency, would).

- Percentiles, the median included: a percentile bootstrap of the difference of the two
  samples' percentiles, other - base, each sample resampled on its own. The p-value
  inverts its confidence interval: the smallest alpha at which the central (1 - alpha)
  interval of the resampled differences excludes 0, that is twice the smaller share of
  differences on either side of 0, with the usual +1 correction (Davison & Hinkley,
  Bootstrap Methods, 1997, ch. 4). A fixed seed makes it deterministic. It costs no
  resampling of whole samples: a resample's sorted draws from n values are the order
  statistics of n uniforms scaled by n, and the k-th of those is Beta(k, n + 1 - k)
  distributed, so only the two order statistics numpy's linear interpolation reads are
  drawn, exactly, whatever the sample size.
  Small samples get no more evidence than they hold. The bootstrap takes a sample as its
  own population, so a 1-value sample's resamples are all that value and 3 against 3
  wholly apart gives p = 0.0002; its p is therefore never below 2 / C(n1 + n2, n1), the
  least any two-sided test of the two samples can give (a permutation test's p of 3
  against 3 wholly apart, 0.1). And a percentile is untested (p = 1: no evidence) in a
  sample too small to hold a value above it besides its largest (a p95 needs 21 values,
  a p99 101): there it is read from the sample's top two values, so its resamples'
  percentile behaves like their maximum, which the bootstrap does not estimate (Bickel &
  Freedman, Ann. Statist. 1981), and nothing in the sample shows how far the tail goes.
- A rate of failures: Fisher's exact test on the 2x2 table (failed, not failed) x
  (base, other), two-sided; exact, so a single extra error in a small run is no
  evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000  # p-values resolve to 2e-4: ample for any usual alpha
BOOTSTRAP_SEED = 0


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
    """Two-sided bootstrap p-value that each percentile of `b` differs from `a`'s, never
    below what the sample sizes allow; 1 for a percentile too far out in a sample to test
    (see the module's docstring); NaN when a sample is empty."""
    if not a or not b:
        return [math.nan] * len(percentiles)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    diff = resampled_percentiles(np.asarray(b), percentiles, rng) - \
        resampled_percentiles(np.asarray(a), percentiles, rng)
    tail = np.minimum((diff <= 0).sum(axis=0), (diff >= 0).sum(axis=0))
    floor = least_two_sided_p(len(a), len(b))
    return [max(floor, min(1.0, 2 * (float(t) + 1) / (BOOTSTRAP_RESAMPLES + 1)))
            if _testable(pct, min(len(a), len(b))) else 1.0
            for t, pct in zip(tail, percentiles, strict=True)]


def least_two_sided_p(n1: int, n2: int) -> float:
    """2 / C(n1 + n2, n1): with no difference, each of the C(n1 + n2, n1) ways to split the
    pooled values into the two samples is as likely, so the most extreme split, or its
    mirror, is no rarer than that by chance. By lgamma: C(200000, 100000) takes a second."""
    log_splits = math.lgamma(n1 + n2 + 1) - math.lgamma(n1 + 1) - math.lgamma(n2 + 1)
    return min(1.0, 2 * math.exp(-log_splits))


def _testable(percentile: float, n: int) -> bool:
    """Whether numpy's linear interpolation reads the percentile of n values at or below
    their second largest, so the sample holds a value above it besides its maximum."""
    # tolerance: 99.9 / 100 * 1000 is 999 + 1e-13 in floating point
    return percentile / 100 * (n - 1) <= n - 2 + 1e-9


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
