"""Profiles, schedules, sweep rates, the SLO bisection, how stages split over workers and
why a stage stopped."""

from __future__ import annotations

import numpy as np
import pytest
from bench_helpers import bench_config, run

from inferlab.bench.config import LoadConfig, Slo, Span, StageLimits
from inferlab.bench.pool import split_stage
from inferlab.bench.profiles import (
    StageSpec,
    bisect_next,
    fixed_stages,
    search_bounds,
    send_offsets_ns,
    sweep_rates,
)
from inferlab.errors import InferlabError

TWO_SECONDS = StageLimits(max_seconds=2.0)


def test_constant_schedule_is_evenly_spaced_within_the_stage():
    offsets = send_offsets_ns(StageSpec("constant", 50.0, None, TWO_SECONDS))
    assert len(offsets) == 100
    assert offsets[:3] == [0, 20_000_000, 40_000_000] and offsets[-1] == 1_980_000_000


def test_max_requests_bounds_the_schedule():
    limits = StageLimits(max_seconds=2.0, max_requests=7)
    assert len(send_offsets_ns(StageSpec("constant", 50.0, None, limits))) == 7


def test_poisson_schedule_is_seeded_with_the_asked_mean_rate():
    limits = StageLimits(max_requests=20_000)
    a = send_offsets_ns(StageSpec("poisson", 100.0, None, limits, seed=3))
    assert a == send_offsets_ns(StageSpec("poisson", 100.0, None, limits, seed=3))
    assert a != send_offsets_ns(StageSpec("poisson", 100.0, None, limits, seed=4))
    gaps_s = [(b - x) / 1e9 for x, b in zip(a, a[1:], strict=False)]
    mean = sum(gaps_s) / len(gaps_s)
    assert mean == pytest.approx(0.01, rel=0.03)  # 20k exponential gaps: sd of mean ~0.7%
    # exponential: the standard deviation equals the mean
    sd = (sum((g - mean) ** 2 for g in gaps_s) / len(gaps_s)) ** 0.5
    assert sd == pytest.approx(mean, rel=0.05)


def test_sweep_rates_run_from_the_synchronous_rate_to_the_throughput_rate():
    # sweep_size counts every stage: 6 in all leaves 4 constant rates after the two measured
    assert sweep_rates(2.0, 12.0, 6) == pytest.approx([4.5, 7.0, 9.5, 12.0])
    assert sweep_rates(2.0, 12.0, 3) == [12.0]
    assert sweep_rates(2.0, 12.0, 2) == []
    assert sweep_rates(12.0, 2.0, 4) == pytest.approx([7.0, 2.0])  # toward throughput
    # guidellm's SweepProfile: np.linspace(sync, throughput, sweep_size - 1)[1:]
    for sync, throughput, size in [(0.1, 0.3, 12), (1.37, 95.2, 10), (3.0, 3.5, 7)]:
        rates = sweep_rates(sync, throughput, size)
        assert rates == pytest.approx(list(np.linspace(sync, throughput, size - 1)[1:]))
        assert rates[-1] == throughput  # exactly: the last stage asks the measured maximum


def test_slo_search_bounds_and_next_probe():
    assert search_bounds([]) == (0.0, None)
    tested = [(2.0, True), (8.0, False), (5.0, True), (6.0, False), (9.0, True)]
    # 9 passed but is above a failure at 6: noise, ignored
    assert search_bounds(tested) == (5.0, 6.0)
    assert bisect_next(5.0, 6.0) == 5.5


def test_fixed_profiles_make_one_stage_per_rate():
    stages = fixed_stages(LoadConfig("concurrent", (1, 16, 64)), TWO_SECONDS)
    assert [s.label for s in stages] == ["concurrent@1", "concurrent@16", "concurrent@64"]
    assert [s.streams for s in stages] == [1, 16, 64]
    (throughput,) = fixed_stages(LoadConfig("throughput", max_concurrency=8), TWO_SECONDS)
    assert throughput.streams == 8 and throughput.label == "throughput@8"


def test_rate_stage_split_deals_sends_in_proportion_to_the_cap():
    # cap 5 over two workers: parts 3 + 2 (5 in flight in all, not 3 + 3); sends 0-4 take
    # slots 0-4, slots 0, 2, 4 are worker 0's, and sends 5-9 take the same slots again
    spec = StageSpec("constant", 10.0, 5, StageLimits(max_seconds=1.0, drain_seconds=2.0))
    plans = split_stage(spec, stage=3, workers=2, start_ns=1_000, ramp_up_s=0)
    assert [p.indices for p in plans] == [(0, 2, 4, 5, 7, 9), (1, 3, 6, 8)]
    assert plans[1].offsets_ns[:3] == (100_000_000, 300_000_000, 600_000_000)
    assert [p.max_in_flight for p in plans] == [3, 2]
    assert plans[0].stop_issuing_ns == 1_000 + 1_000_000_000
    assert plans[0].hard_stop_ns == 1_000 + 3_000_000_000


def test_an_in_flight_cap_below_the_worker_count_leaves_workers_idle():
    # --max-concurrency 2 --workers 4: two workers may each have one request in flight, the
    # other two are dealt nothing (a cap of 1 each would allow 4 in flight)
    spec = StageSpec("constant", 10.0, 2, StageLimits(max_seconds=0.6))
    plans = split_stage(spec, stage=0, workers=4, start_ns=0, ramp_up_s=0)
    assert [p.max_in_flight for p in plans] == [1, 1, 0, 0]
    assert [p.indices for p in plans] == [(0, 2, 4), (1, 3, 5), (), ()]
    assert [p.offsets_ns for p in plans][2:] == [(), ()]
    uncapped = split_stage(StageSpec("constant", 10.0, None, StageLimits(max_seconds=0.3)),
                           0, 4, 0, 0)
    assert [p.indices for p in uncapped] == [(0,), (1,), (2,), ()]
    assert all(p.max_in_flight is None for p in uncapped)


def test_stream_stage_split_deals_streams_and_requests_in_proportion():
    spec = StageSpec("concurrent", 5.0, None, StageLimits(max_requests=10))
    plans = split_stage(spec, stage=0, workers=2, start_ns=0, ramp_up_s=1.0)
    assert [p.streams for p in plans] == [2, 3]
    assert [p.max_requests for p in plans] == [4, 6]
    assert [p.stream_offset for p in plans] == [0, 2]
    assert all(p.hard_stop_ns is None for p in plans)  # bounded by requests, not time
    sync = split_stage(StageSpec("synchronous", None, None, StageLimits(max_requests=9)),
                       0, 2, 0, 0)
    assert [(p.streams, p.max_requests) for p in sync] == [(0, 0), (1, 9)]


def test_throughput_stage_with_a_request_cap_queues_everything_at_the_start():
    capped = StageSpec("throughput", None, 4, StageLimits(max_requests=100))
    assert split_stage(capped, 0, 1, 0, 0)[0].queued_at_start
    timed = StageSpec("throughput", None, 4, StageLimits(max_seconds=3))
    assert not split_stage(timed, 0, 1, 0, 0)[0].queued_at_start


def test_span_parsing():
    assert Span.parse("5", "--warmup") == Span(seconds=5.0)
    assert Span.parse("2.5s", "--warmup") == Span(seconds=2.5)
    assert Span.parse("0.1", "--warmup") == Span(fraction=0.1)
    assert Span.parse("10%", "--warmup") == Span(fraction=0.1)
    assert Span.parse("10%", "--warmup").resolve_s(30.0) == pytest.approx(3.0)
    with pytest.raises(InferlabError, match="bad --cooldown 'soon'"):
        Span.parse("soon", "--cooldown")


def test_slo_parsing():
    assert Slo.parse("ttft_ms=500, itl_ms=50").bounds() == {"ttft_ms": 500.0, "itl_ms": 50.0}
    for bad in ("ttft=5", "ttft_ms=fast", "", "ttft_ms=-1"):
        with pytest.raises(InferlabError):
            Slo.parse(bad)


@pytest.mark.parametrize("profile, rates, message", [
    ("constant", (), "needs --rate"),
    ("synchronous", (3.0,), "takes no rate"),
    ("throughput", (3.0,), "--max-concurrency"),
    ("concurrent", (2.5,), "whole number of streams"),
    ("warp", (), "unknown --profile"),
])
def test_load_config_errors(profile, rates, message):
    with pytest.raises(InferlabError, match=message):
        LoadConfig(profile, rates)


def test_a_stage_needs_a_bound():
    with pytest.raises(InferlabError, match="--max-seconds or --max-requests"):
        StageLimits()


def test_a_rate_stage_cut_by_max_seconds_says_so(mock_server, corpus):
    # 10 req/s for 1 s: the schedule ends at 0.9 s and every request is done well before
    # 1 s, but the stage ended because --max-seconds cut its schedule, not by itself
    config = bench_config(mock_server(), corpus, "constant", (10.0,), max_seconds=1.0,
                          data="prompt_tokens=16,output_tokens=2")
    (stage,) = run(config).stages
    assert stage.summary.counts["ok"] == 10
    assert stage.summary.info.stop_reason == "max_seconds"
