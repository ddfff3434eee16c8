"""`bench compare`'s gate on synthetic stages whose statistics are known: each statistic
judged by a test of its own, the error rate and goodput gated, stages paired right."""

from __future__ import annotations

import numpy as np
import pytest
from bench_helpers import synthetic_stage as stage
from rich.console import Console

from inferlab.bench.compare import compare, pair_stages, regressions
from inferlab.bench.compare_report import print_comparison
from inferlab.bench.profiles import StageSpec
from inferlab.bench.report_json import LoadedRun, LoadedStage
from inferlab.bench.significance import fisher_exact, resampled_percentiles
from inferlab.bench.stats import STAT_NAMES
from inferlab.errors import InferlabError

TAIL_BASE = list(np.linspace(18, 24, 200))
# +200 ms on every 10th request: the median barely moves, the p95 is 9x
TAIL_OTHER = [v + (200 if i % 10 == 0 else 0) for i, v in enumerate(TAIL_BASE)]


def run(*stages: LoadedStage) -> LoadedRun:
    return LoadedRun("r.json", {}, list(stages))


def row(rows: list, metric: str, stat: str = ""):
    return next(r for r in rows if r.metric == metric and r.stat == stat)


def test_the_bootstrap_resamples_percentiles_like_a_brute_force_bootstrap():
    values = np.random.default_rng(1).lognormal(3, 0.5, 37)
    percentiles = [50, 95, 99.9]
    fast = resampled_percentiles(values, percentiles, np.random.default_rng(0))
    # the textbook bootstrap: resample with replacement, take numpy's percentiles
    draws = np.random.default_rng(2).choice(values, (20_000, values.size))
    brute = np.percentile(draws, percentiles, axis=1).T
    assert fast.mean(axis=0) == pytest.approx(brute.mean(axis=0), rel=0.02)
    assert fast.std(axis=0) == pytest.approx(brute.std(axis=0), rel=0.05)


def test_a_tail_only_regression_fails_the_gate_on_its_p95():
    comparison = compare(run(stage(TAIL_BASE)), run(stage(TAIL_OTHER)))
    p95, median = row(comparison.rows, "ttft_ms", "p95"), row(comparison.rows, "ttft_ms", "median")
    assert p95.change > 5 and p95.p_value < 0.001  # 10,000 resamples, none at or below 0
    # the median's own test (its bootstrap) sees little, and its change is small anyway
    assert median.p_value > 0.05
    failed = {(r.metric, r.stat) for r in regressions(comparison, 20, 0.05)}
    assert ("ttft_ms", "p95") in failed and ("ttft_ms", "median") not in failed
    # the report shows the p-value each row was judged with
    console = Console(record=True, width=200)
    print_comparison(comparison, console, 0.05)
    line = next(x for x in console.export_text().splitlines() if "ttft_ms p95" in x)
    assert line.rstrip(" │").endswith("0.0002")  # 2 * (0 + 1) / (10,000 + 1)


def test_a_median_moving_the_other_way_lends_no_significance_to_the_p95():
    base = list(np.linspace(80, 120, 60))
    # 30% faster, but 4 slow outliers put the p95 21% higher (150 vs 118 ms + interp.)
    other = [0.7 * v for v in base[:-4]] + [150.0] * 4
    comparison = compare(run(stage(base)), run(stage(other)))
    p95, median = row(comparison.rows, "ttft_ms", "p95"), row(comparison.rows, "ttft_ms", "median")
    assert p95.change == pytest.approx(150 / 118 - 1, abs=0.01) and p95.p_value > 0.5
    assert median.p_value < 0.001
    assert not [r for r in regressions(comparison, 20, 0.05) if r.metric == "ttft_ms"]


def test_untested_statistics_show_no_p_value():
    comparison = compare(run(stage(TAIL_BASE)), run(stage(TAIL_OTHER)))
    untested = {r.stat for r in comparison.rows if r.metric == "ttft_ms" and r.p_value is None}
    assert untested == {"mean", "min", "max"} and len(STAT_NAMES) == 8


def test_fisher_exact_on_known_tables():
    # Fisher's tea tasting, 3 of 4 right: tables as or less likely than the observed one,
    # (1 + 16 + 16 + 1) / 70
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)
    # one error in 200 against none: both possible tables are as likely
    assert fisher_exact(0, 200, 1, 200) == pytest.approx(1.0)
    # 0/10 vs 3/10: P(observed) = C(10,0) C(10,3) / C(20,3) = 120 / 1140; the mirror
    # table (3, 0) is as likely, the others likelier: p = 240 / 1140
    assert fisher_exact(0, 10, 3, 10) == pytest.approx(240 / 1140)


def test_the_error_rate_is_gated_in_points_and_needs_significance():
    ttfts = [20.0] * 122
    comparison = compare(run(stage(ttfts)), run(stage(ttfts, errors=78)))
    errors = row(comparison.rows, "error_rate")
    assert errors.base == 0 and errors.other == pytest.approx(0.39)
    assert errors.change == pytest.approx(0.39) and errors.points  # +39 points, not a ratio
    assert errors in regressions(comparison, 38, 0.05)
    assert errors not in regressions(comparison, 40, 0.05)  # 39 points is within 40
    console = Console(record=True, width=200)
    print_comparison(comparison, console, 0.05)
    assert "+39.0 pts" in console.export_text()
    # one extra error in 20 requests is +5 points, but no evidence of a change
    small = compare(run(stage([20.0] * 20)), run(stage([20.0] * 19, errors=1)))
    one_more = row(small.rows, "error_rate")
    assert one_more.change == pytest.approx(0.05) and one_more.p_value == pytest.approx(1.0)
    assert one_more not in regressions(small, 1, 0.05)


def test_goodput_is_gated_like_the_other_throughputs():
    fast, slow = [20.0] * 100, [20.0] * 10 + [300.0] * 90  # 90 of 100 miss a 100 ms SLO
    comparison = compare(run(stage(fast, slo_ttft_ms=100)), run(stage(slow, slo_ttft_ms=100)))
    goodput = row(comparison.rows, "goodput")
    assert goodput.change == pytest.approx(-0.9, abs=0.02)
    assert goodput in regressions(comparison, 50, 0.05)


def test_stages_sharing_a_label_pair_by_position():
    a, b = stage([20.0] * 30), stage([40.0] * 30)  # both "constant@20/s"
    comparison = compare(run(a, b), run(a, b))
    assert [(x.summary, y.summary) for x, y in pair_stages(run(a, b), run(a, b))] == \
        [(a.summary, a.summary), (b.summary, b.summary)]
    assert all(r.change in (0, None) for r in comparison.rows)
    # unique labels still pair by name, whatever the order
    c = stage([40.0] * 30, label="constant@40/s")
    assert [(x.label, y.label) for x, y in pair_stages(run(a, c), run(c, a))] == \
        [("constant@20/s", "constant@20/s"), ("constant@40/s", "constant@40/s")]


def test_a_stage_only_one_run_has_is_refused_whichever_is_the_base():
    """Paired by name, the base's stages once only had to be among the other's: a stage the
    other run added went unseen (and the gate passed on the rest), while swapped the runs were
    refused."""
    a, c = stage([20.0] * 30), stage([40.0] * 30, label="constant@40/s")
    for base, other in ((run(a), run(a, c)), (run(a, c), run(a))):
        with pytest.raises(InferlabError, match="cannot pair the stages"):
            pair_stages(base, other)


def test_labels_tell_distinct_rates_apart():
    def label(rate: float) -> str:
        return StageSpec("constant", rate, None, None).label  # type: ignore[arg-type]

    assert label(1000.1) != label(1000.4)
    assert label(20.0) == "constant@20/s" and label(2.5) == "constant@2.5/s"
