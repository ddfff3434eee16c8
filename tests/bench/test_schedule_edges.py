"""Edges of a rate stage's schedule: where it ends, how --max-concurrency is shared by
worker processes, and which flags and target URLs a run takes."""

from __future__ import annotations

import pytest
from bench_helpers import bench_config, run, with_workers

from inferlab.bench.config import LoadConfig, StageLimits, TargetConfig
from inferlab.bench.metrics import dispatch_lag_ms
from inferlab.bench.pool import split_stage
from inferlab.bench.profiles import StageSpec, send_offsets_ns
from inferlab.cli import main


@pytest.mark.parametrize("rate, seconds, sends, last_ns", [
    # k / rate < seconds: rate x seconds sends; the next would fall on --max-seconds itself
    (7.0, 1.0, 7, 857_142_857),  # 6/7 s
    (3.0, 2.0, 6, 1_666_666_667),  # 5/3 s
    (6.0, 1.0, 6, 833_333_333),  # 5/6 s
    (30.0, 10.0, 300, 9_966_666_667),  # 299/30 s
    (10.0, 1.0, 10, 900_000_000),
    (0.3, 10.0, 3, 6_666_666_667),  # 0.3 is not a binary fraction: 3 / 0.3 s is 10 s
    (2.5, 1.0, 3, 800_000_000),  # 2.5 sends a second: 0, 0.4, 0.8 s
])
def test_a_constant_schedule_ends_strictly_before_max_seconds(rate, seconds, sends, last_ns):
    offsets = send_offsets_ns(StageSpec("constant", rate, None,
                                        StageLimits(max_seconds=seconds)))
    assert len(offsets) == sends and offsets[-1] == last_ns


def test_a_poisson_schedule_ends_strictly_before_max_seconds():
    for seed in range(20):
        spec = StageSpec("poisson", 50.0, None, StageLimits(max_seconds=1.0), seed=seed)
        assert max(send_offsets_ns(spec)) < 1_000_000_000


def test_a_cap_of_3_over_2_workers_is_dealt_2_and_1_with_the_sends_to_match():
    spec = StageSpec("constant", 12.0, 3, StageLimits(max_seconds=1.0))
    plans = split_stage(spec, stage=0, workers=2, start_ns=0, ramp_up_s=0)
    assert [p.max_in_flight for p in plans] == [2, 1]
    # sends 0, 1, 2 take slots 0, 1, 2 (worker 0, 1, 0), then the same slots again
    assert [p.indices for p in plans] == [(0, 2, 3, 5, 6, 8, 9, 11), (1, 4, 7, 10)]


@pytest.mark.parametrize("cap, workers", [(3, 2), (5, 2), (7, 3), (2, 4), (64, 4), (10, 3)])
def test_any_cap_consecutive_sends_fit_each_workers_part(cap, workers):
    # the property of one shared cap at a steady rate: send k reuses the slot of send
    # k - cap, so among any `cap` consecutive sends each worker has exactly its part
    spec = StageSpec("constant", 100.0, cap, StageLimits(max_seconds=2.0))
    plans = split_stage(spec, stage=0, workers=workers, start_ns=0, ramp_up_s=0)
    parts = [p.max_in_flight for p in plans]
    assert sum(parts) == cap and max(parts) - min(parts) <= 1
    owner = {k: w for w, p in enumerate(plans) for k in p.indices}
    assert sorted(owner) == list(range(200))  # every send dealt, once
    for start in range(200 - cap + 1):
        window = [owner[k] for k in range(start, start + cap)]
        assert [window.count(w) for w in range(workers)] == parts


def test_a_cap_shared_by_two_workers_keeps_the_schedule(mock_server, corpus):
    # 10 sends a second lasting ~250 ms: 2.5 in flight, under the cap of 3. Dealt evenly
    # over parts of 1 and 2, the worker with 1 slot got a send every 200 ms and fell
    # 50 ms further behind with each
    url = mock_server(ttft_ms=245, itl_ms=1)
    config = bench_config(url, corpus, "constant", (10.0,), max_seconds=2.0,
                          max_concurrency=3, data="prompt_tokens=16,output_tokens=2")
    (stage,) = run(with_workers(config, 2)).stages
    assert stage.summary.info.scheduled == 20
    assert sum(r.start_ns is not None for r in stage.records) == 20
    assert {r.worker for r in stage.records} == {0, 1}
    assert max(dispatch_lag_ms(r) for r in stage.records) < 100
    assert stage.summary.concurrency_max <= 3


def test_scheduled_requests_are_all_sent_or_counted_never_sent(mock_server, corpus):
    # 7 a second for 1 s under a cap of 1, each lasting ~300 ms: the cap holds sends back
    # and those due before the end but not sent by then count as never sent
    url = mock_server(ttft_ms=300, itl_ms=1)
    config = bench_config(url, corpus, "constant", (7.0,), max_seconds=1.0,
                          max_concurrency=1, data="prompt_tokens=16,output_tokens=2")
    (stage,) = run(config).stages
    sent = [r for r in stage.records if r.start_ns is not None]
    never_sent = [r for r in stage.records if r.start_ns is None]
    assert stage.summary.info.scheduled == 7 == len(sent) + len(never_sent)
    assert 2 <= len(sent) <= 4 and all(r.outcome == "cancelled" for r in never_sent)
    assert sorted(r.index for r in stage.records) == list(range(7))


@pytest.mark.parametrize("profile, rate", [("concurrent", "4"), ("synchronous", None)])
def test_max_concurrency_is_refused_where_streams_bound_the_load(profile, rate, capsys):
    argv = ["bench", "--target", "http://127.0.0.1:9", "--profile", profile,
            "--max-seconds", "1", "--max-concurrency", "2", *(["--rate", rate] if rate else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--profile {profile} takes no --max-concurrency" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_max_concurrency_still_caps_rates_throughput_and_sweeps():
    for profile, rates in (("constant", (5.0,)), ("poisson", (5.0,)), ("throughput", ()),
                           ("sweep", ())):
        assert LoadConfig(profile, rates, max_concurrency=4).max_concurrency == 4


@pytest.mark.parametrize("given, root", [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),  # an OpenAI SDK's base_url
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
    ("https://gateway.example/llm/v1", "https://gateway.example/llm"),
    ("127.0.0.1:8000/v1", "http://127.0.0.1:8000"),  # a bare host: http, as curl reads it
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://v1:8000", "http://v1:8000"),  # a host named v1 is no path
    ("http://h/v10", "http://h/v10"),
    ("http://h/v1/extra", "http://h/v1/extra"),
])
def test_a_target_ending_in_v1_names_the_server_root(given, root):
    assert TargetConfig(given).url == root


def test_a_run_against_an_sdk_style_base_url(mock_server, corpus):
    url = mock_server(itl_ms=1)
    config = bench_config(url + "/v1", corpus, "synchronous", max_requests=3,
                          max_seconds=None, scrape=True)
    result = run(config)
    (stage,) = result.stages
    assert stage.summary.counts == {"ok": 3, "error": 0, "cancelled": 0}
    assert result.meta["target"] == url
    assert result.server.available, result.server.note  # /metrics, not /v1/metrics
