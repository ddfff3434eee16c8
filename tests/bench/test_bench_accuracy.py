"""Reported latencies against a mock with known injected latencies.

The issue's targets (TTFT and ITL within 2 ms at 1, 16 and 64 streams; 50 req/s within
2%) are timing claims, checked strictly by benchmarks/bench_client_floor.py on a quiet
machine. Here, on a shared 2-core machine that also runs the mock, the bounds are what
causality guarantees (nothing arrives before it is sent) plus a margin that only a
wrong reference point or a miscounted token would break.
"""

from __future__ import annotations

import pytest
from bench_helpers import bench_config, run

TTFT_MS, ITL_MS = 50.0, 10.0


def test_ttft_and_itl_match_the_injected_latency_at_1_16_64_streams(mock_server, corpus):
    url = mock_server(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    # streams start spread over one ITL, as a real server's requests drift apart
    config = bench_config(url, corpus, "concurrent", (1, 16, 64), max_seconds=1.2,
                          data="prompt_tokens=32,output_tokens=16", ramp_up_s=0.01)
    result = run(config)
    assert [s.summary.info.label for s in result.stages] == [
        "concurrent@1", "concurrent@16", "concurrent@64"]
    for stage in result.stages:
        s = stage.summary
        assert s.counts["error"] == 0 and s.counts["ok"] >= 5
        ttft, itl = s.metrics["ttft_ms"]["ok"], s.metrics["itl_ms"]["ok"]
        assert ttft.min >= TTFT_MS and ttft.median < TTFT_MS + 25
        assert ITL_MS - 1 < itl.median < ITL_MS + 3
        assert s.metrics["output_tokens"]["ok"].min == 16
        assert s.concurrency_max == int(stage.spec.rate)


def test_constant_rate_is_achieved(mock_server, corpus):
    url = mock_server(ttft_ms=5, itl_ms=1)
    result = run(bench_config(url, corpus, "constant", (50.0,), max_seconds=3.0))
    (stage,) = result.stages
    s = stage.summary
    assert s.counts == {"ok": 150, "error": 0, "cancelled": 0}
    assert s.scheduled_rate == pytest.approx(50.0, rel=1e-6)
    assert s.sent_rate == pytest.approx(50.0, rel=0.05)
    lag = s.metrics["dispatch_lag_ms"]["ok"]
    assert lag.min >= 0 and lag.median < 20


def test_chat_endpoint_and_the_floor_beside_the_results(mock_server, corpus):
    url = mock_server(ttft_ms=30, itl_ms=5)
    config = bench_config(url, corpus, "concurrent", (4,), max_seconds=1.0, chat=True,
                          calibration_seconds=0.5)
    (stage,) = run(config).stages
    ttft = stage.summary.metrics["ttft_ms"]["ok"]
    assert ttft.min >= 30  # the role-only first chunk is not the first token
    assert stage.floor is not None and stage.floor.info.label.startswith("floor ")
    floor_ttft = stage.floor.metrics["ttft_ms"]["ok"]
    assert floor_ttft.count > 0 and floor_ttft.median < ttft.median
