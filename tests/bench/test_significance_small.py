"""`bench compare`'s tests on samples whose answer is known: no more evidence than a small
sample holds, a median judged on the median, Mann-Whitney exact where scipy's is."""

from __future__ import annotations

import numpy as np
import pytest
from bench_helpers import synthetic_stage as stage

from inferlab.bench.compare import compare, regressions
from inferlab.bench.report_json import LoadedRun
from inferlab.bench.significance import percentile_difference_p


def run(*ttfts_ms: list[float]) -> LoadedRun:
    return LoadedRun("r.json", {}, [stage(list(t)) for t in ttfts_ms])


def ttft_row(comparison, stat: str):
    return next(r for r in comparison.rows if r.metric == "ttft_ms" and r.stat == stat)


@pytest.mark.parametrize(("n", "least_p"), [
    (1, 1.0),  # 2 of the 2 ways to split 2 values into 1 + 1: no evidence at all
    (2, 1.0),  # a median of 2 values reads the largest: untested (and 2 of 6 splits)
    (3, 0.1),  # 2 of C(6, 3) = 20 splits; the exact Mann-Whitney p of 3 against 3 apart
    (4, 2 / 70),  # 2 of C(8, 4) = 70
])
def test_samples_wholly_apart_give_no_more_evidence_than_their_size_holds(n, least_p):
    base, other = [10.0 + i for i in range(n)], [100.0 + i for i in range(n)]
    median, p95 = percentile_difference_p(base, other, [50, 95])
    # the bootstrap alone said 2 / 10,001 for each: a 1-value sample resamples to itself
    assert median == pytest.approx(least_p)
    assert p95 == 1.0  # under 21 values a p95 lies between the top two: untested


def test_one_or_three_requests_a_side_fail_no_gate():
    for n in (1, 3):
        comparison = compare(run([20.0 + i for i in range(n)]),
                             run([30.0 + i for i in range(n)]))
        assert ttft_row(comparison, "median").change > 0.3
        assert not [r for r in regressions(comparison, 5, 0.05) if r.stat], n


def test_a_p95_is_tested_once_a_value_lies_above_it_besides_the_largest():
    # numpy's p95 of 21 values is the second largest; of 20, between the top two
    assert np.percentile(np.arange(21), 95) == 19 and np.percentile(np.arange(20), 95) == 18.05
    assert np.percentile(np.arange(101), 99) == 99 and np.percentile(np.arange(100), 99) == 98.01
    for n, p95_tested, p99_tested in ((20, False, False), (21, True, False), (101, True, True)):
        base, other = list(np.linspace(10, 20, n)), list(np.linspace(100, 120, n))
        p95, p99 = percentile_difference_p(base, other, [95, 99])
        # tested and wholly apart: no resampled difference at or below 0 -> 2 / 10,001
        assert p95 == pytest.approx(2 / 10_001 if p95_tested else 1.0)
        assert p99 == pytest.approx(2 / 10_001 if p99_tested else 1.0)


def brute_bootstrap_median_p(a: list[float], b: list[float], resamples: int = 4000) -> float:
    """The textbook bootstrap: resample each sample with replacement, take the medians."""
    rng = np.random.default_rng(5)
    diff = np.median(rng.choice(b, (resamples, len(b))), axis=1) - \
        np.median(rng.choice(a, (resamples, len(a))), axis=1)
    return 2 * min((diff <= 0).mean(), (diff >= 0).mean())


def test_a_median_rise_in_a_faster_run_is_judged_by_the_median():
    # other is faster overall (49 of its 100 near 5 ms), yet its median is 5% up: a test of
    # "tends to be larger" (Mann-Whitney, p < 1e-4 the other way) is no test of the median
    base = [10.0 + 0.01 * i for i in range(50)] + [20.0 + 0.01 * i for i in range(50)]
    other = [5.0 + 0.01 * i for i in range(49)] + [16.0 + 0.01 * i for i in range(51)]
    assert np.mean(other) < np.mean(base)
    comparison = compare(run(base), run(other))
    median = ttft_row(comparison, "median")
    assert median.change == pytest.approx(16.005 / 15.245 - 1)
    reference = brute_bootstrap_median_p(base, other)
    assert reference > 0.4 and median.p_value == pytest.approx(reference, abs=0.05)
    assert median not in regressions(comparison, 1, 0.05)


def test_a_median_that_moved_still_fails_the_gate():
    base = list(np.linspace(18, 24, 200))
    comparison = compare(run(base), run([1.1 * v for v in base]))
    median = ttft_row(comparison, "median")
    assert median.p_value == pytest.approx(2 / 10_001) and brute_bootstrap_median_p(
        base, [1.1 * v for v in base]) == 0
    assert median in regressions(comparison, 5, 0.05)
