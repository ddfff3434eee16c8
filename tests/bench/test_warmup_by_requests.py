"""A fractional --warmup / --cooldown in a stage that --max-requests alone bounds counts
requests, as guidellm's TransientPhaseConfig.compute_limits does: int(0.2 * 20) = 4 requests
left out at the start (warmup) or at the end (cooldown). A throughput stage starts all its
requests at once, so a fraction of its duration would leave none measured."""

from __future__ import annotations

from bench_helpers import bench_config, run

from inferlab.bench.config import Span, StageLimits
from inferlab.bench.records import RequestRecord
from inferlab.bench.summary import StageInfo, measured, summarize

MS = 1_000_000  # ns
US = 1_000
INFO = StageInfo(stage=0, label="throughput@256", kind="throughput", rate=None, start_ns=0,
                 stop_reason="max_requests", scheduled=20)


def burst(n: int = 20) -> list[RequestRecord]:
    """A throughput stage: request i sent at i * 10 us, first token 100 ms later, then 4 more
    tokens 20 ms apart; all run side by side."""
    records = []
    for i in range(n):
        start = i * 10 * US
        chunks = [start + 100 * MS + k * 20 * MS for k in range(5)]
        records.append(RequestRecord(
            stage=0, index=i, outcome="ok", error="", status=200, intended_ns=0,
            start_ns=start, first_token_ns=chunks[0], end_ns=chunks[-1] + MS,
            chunk_ns=chunks, chunk_tokens=[1] * 5, output_tokens=5,
            output_tokens_source="usage", prompt_tokens=20))
    return records


def test_a_fractional_warmup_leaves_out_the_first_requests_sent():
    records = burst()
    s = summarize(INFO, records, Span(fraction=0.2), Span(), None, requests_bound=20)
    assert s.warnings == []
    assert s.counts == {"ok": 16, "error": 0, "cancelled": 0}  # 20 - int(0.2 * 20)
    assert s.metrics["ttft_ms"]["ok"].count == 16
    assert [r.index for r in measured(s, records)] == list(range(4, 20))
    assert s.window_start_ns == 40 * US  # the fifth send


def test_a_fractional_cooldown_leaves_out_the_last_requests_sent():
    records = burst()
    s = summarize(INFO, records, Span(fraction=0.2), Span(fraction=0.2), None,
                  requests_bound=20)
    assert s.counts["ok"] == 12
    assert [r.index for r in measured(s, records)] == list(range(4, 16))
    # the window closes when the last measured request (sent at 150 us) ended
    assert s.window_end_ns == 150 * US + 181 * MS


def test_the_counted_window_survives_the_json_round_trip():
    records = burst()
    s = summarize(INFO, records, Span(fraction=0.1), Span(fraction=0.1), None,
                  requests_bound=20)
    loaded = type(s).from_dict(s.to_dict())
    assert [r.index for r in measured(loaded, records)] == list(range(2, 18))


def test_a_stage_bounded_by_time_keeps_the_fraction_of_its_duration():
    # --max-seconds set: guidellm's prefer_duration reads the fraction as of the duration
    assert StageLimits(max_seconds=2.0, max_requests=20).requests_bound is None
    assert StageLimits(max_requests=20).requests_bound == 20


def test_a_window_that_leaves_no_request_measured_is_a_warning():
    records = burst()
    s = summarize(INFO, records, Span(fraction=0.5), Span(fraction=0.5), None,
                  requests_bound=20)
    assert s.warnings == ["warmup + cooldown leave no request measured; statistics use the "
                          "whole stage"]
    assert s.counts["ok"] == 20


def test_a_time_window_holding_no_send_is_a_warning_not_empty_statistics():
    # bounded by time, 20% of a 181 ms stage is 36 ms: every send (0..190 us) falls before it
    records = burst()
    s = summarize(INFO, records, Span(fraction=0.2), Span(), None)
    assert s.warnings == ["warmup + cooldown leave no request measured; statistics use the "
                          "whole stage"]
    assert s.counts["ok"] == 20 and s.metrics["ttft_ms"]["ok"].count == 20


def test_a_throughput_run_with_a_fractional_warmup_measures_the_rest(mock_server, corpus):
    url = mock_server(ttft_ms=50, itl_ms=5)
    config = bench_config(url, corpus, "throughput", max_seconds=None, max_requests=20,
                          warmup=Span(fraction=0.2), data="prompt_tokens=16,output_tokens=4")
    (stage,) = run(config).stages
    assert stage.summary.counts == {"ok": 16, "error": 0, "cancelled": 0}
    assert stage.summary.metrics["ttft_ms"]["ok"].count == 16
    assert stage.summary.warnings == []
