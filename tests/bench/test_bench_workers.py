"""Two worker processes share a stage: every scheduled request is sent once, by one of them."""

from __future__ import annotations

from bench_helpers import bench_config, run, with_workers


def test_two_workers_split_a_rate_stage_and_a_closed_loop(mock_server, corpus):
    url = mock_server(ttft_ms=5, itl_ms=1)
    rate = run(with_workers(bench_config(url, corpus, "constant", (40.0,), max_seconds=1.0), 2))
    (stage,) = rate.stages
    assert sorted(r.index for r in stage.records) == list(range(40))
    assert {r.worker for r in stage.records} == {0, 1}
    assert all(r.worker == r.index % 2 for r in stage.records)  # dealt round-robin
    assert stage.summary.counts["ok"] == 40
    loops = run(with_workers(bench_config(url, corpus, "concurrent", (3,), max_requests=30,
                                          max_seconds=None), 2))
    (stage,) = loops.stages
    assert len(stage.records) == 30 and len({r.index for r in stage.records}) == 30
    assert stage.summary.concurrency_max == 3
    assert stage.summary.info.stop_reason == "max_requests"


def test_max_concurrency_holds_across_workers(mock_server, corpus):
    # sends every 25 ms to requests that take 40+ ms: uncapped, two overlap; capped at 1
    # over two workers, the second worker has no part of the cap and sends nothing
    url = mock_server(ttft_ms=40, itl_ms=1)
    config = bench_config(url, corpus, "constant", (40.0,), max_seconds=0.5,
                          max_concurrency=1, data="prompt_tokens=16,output_tokens=2")
    (stage,) = run(with_workers(config, 2)).stages
    sent = [r for r in stage.records if r.start_ns is not None]
    assert len(sent) >= 5 and {r.worker for r in sent} == {0}
    assert stage.summary.concurrency_max == 1
