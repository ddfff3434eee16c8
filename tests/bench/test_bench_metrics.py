"""Metrics on hand-built request timelines whose answers were worked out on paper."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from inferlab.bench.config import Span
from inferlab.bench.metrics import (
    chunk_gap_samples_ms,
    dispatch_lag_ms,
    e2e_intended_ms,
    e2e_ms,
    itl_ms,
    itl_token_samples_ms,
    tpot_ms,
    ttft_intended_ms,
    ttft_ms,
)
from inferlab.bench.records import RequestRecord
from inferlab.bench.stats import Distribution
from inferlab.bench.summary import StageInfo, slo_percentile_check, summarize
from inferlab.bench.timeline import build_timeline

MS = 1_000_000  # ns


def rec(outcome: str, intended: float, start: float | None, end: float | None,
        chunks: list[float] = (), tokens: list[int] = (), output: int = 0,
        prompt: int | None = None) -> RequestRecord:
    """A record with times given in ms."""
    def ns(ms: float | None) -> int | None:
        return None if ms is None else round(ms * MS)

    return RequestRecord(
        stage=0, index=0, outcome=outcome, error="" if outcome == "ok" else "x", status=200,
        intended_ns=ns(intended), start_ns=ns(start),
        first_token_ns=ns(chunks[0]) if chunks else None, end_ns=ns(end),
        chunk_ns=[ns(c) for c in chunks], chunk_tokens=list(tokens), output_tokens=output,
        output_tokens_source="usage", prompt_tokens=prompt)


# A: on time; four one-token chunks 10 ms apart.
A = rec("ok", 0, 0, 135, [100, 110, 120, 130], [1, 1, 1, 1], output=4, prompt=10)
# B: sent 10 ms late; two chunks of two tokens each.
B = rec("ok", 50, 60, 310, [260, 300], [2, 2], output=4, prompt=20)
# C: failed after 50 ms without a token; D: scheduled but never sent.
C = rec("error", 100, 100, 150)
D = rec("cancelled", 120, None, None)
INFO = StageInfo(stage=0, label="constant@20/s", kind="constant", rate=20.0, start_ns=0,
                 stop_reason="max_seconds", scheduled=4)


def test_per_request_latencies():
    assert ttft_ms(A) == 100 and ttft_intended_ms(A) == 100
    assert itl_ms(A) == pytest.approx(10.0)  # (130 - 100) / (4 - 1)
    assert tpot_ms(A) == pytest.approx(33.75)  # 135 / 4
    assert e2e_ms(A) == 135
    assert ttft_ms(B) == 200 and ttft_intended_ms(B) == 210
    assert itl_ms(B) == pytest.approx(40 / 3)  # (300 - 260) / (4 - 1)
    assert tpot_ms(B) == pytest.approx(62.5)  # (310 - 60) / 4
    assert (e2e_ms(B), e2e_intended_ms(B), dispatch_lag_ms(B)) == (250, 260, 10)
    assert ttft_ms(C) is None and itl_ms(C) is None
    assert dispatch_lag_ms(D) is None and e2e_ms(D) is None


def test_per_token_and_per_chunk_samples():
    assert itl_token_samples_ms(A) == pytest.approx([10, 10, 10])
    assert itl_token_samples_ms(B) == pytest.approx([20, 20])  # a 40 ms gap carried 2 tokens
    assert chunk_gap_samples_ms(B) == pytest.approx([40])


def test_distribution_percentiles_of_one_to_ten():
    d = Distribution.of(list(range(1, 11)))
    assert (d.count, d.mean, d.median, d.min, d.max) == (10, 5.5, 5.5, 1, 10)
    assert d.p90 == pytest.approx(9.1) and d.p95 == pytest.approx(9.55)
    assert d.p99 == pytest.approx(9.91) and d.p999 == pytest.approx(9.991)
    assert d.stdev == pytest.approx(math.sqrt(55 / 6))
    assert Distribution.of([]).count == 0 and Distribution.of([]).median is None


def test_stage_summary_without_warmup():
    s = summarize(INFO, [A, B, C, D], Span(), Span(), slo={"ttft_ms": 150.0})
    assert (s.window_start_ns, s.window_end_ns, s.end_ns) == (0, 310 * MS, 310 * MS)
    assert s.counts == {"ok": 2, "error": 1, "cancelled": 1}
    assert s.request_throughput == pytest.approx(2 / 0.31)
    assert s.output_token_throughput == pytest.approx(8 / 0.31)
    assert s.total_token_throughput == pytest.approx((8 + 30) / 0.31)
    assert s.sent_rate == pytest.approx(20.0)  # 3 starts over 100 ms
    assert s.scheduled_rate == pytest.approx(20.0)  # intended 0, 50, 100 ms
    assert s.concurrency_mean == pytest.approx(435 / 310)  # busy 135 + 250 + 50 ms
    assert s.concurrency_max == 3  # A, B and C overlap in 100..135 ms
    assert s.goodput == pytest.approx(1 / 0.31)  # only A meets TTFT <= 150 from intended
    assert s.slo_fraction == pytest.approx(1 / 4)
    ttft = s.metrics["ttft_ms"]["ok"]
    assert (ttft.count, ttft.mean, ttft.p90) == (2, 150, pytest.approx(190))
    per_token = s.metrics["itl_token_ms"]["ok"]
    assert (per_token.count, per_token.mean, per_token.median) == (5, pytest.approx(14), 10)
    assert s.metrics["e2e_ms"]["error"].mean == 50
    assert s.metrics["dispatch_lag_ms"]["ok"].max == 10


def test_sent_rate_is_not_skewed_by_one_late_send():
    # 100 sends every 20 ms, the last one 100 ms late: (n - 1) / (last - first) would say
    # 99 / 2.08 s = 47.6 req/s. The fitted slope moves by 100 ms * 49.5 / 83325 (the
    # last rank's distance from the mean rank over the sum of squared distances).
    intended = [20.0 * i for i in range(100)]
    starts = intended[:-1] + [intended[-1] + 100]
    records = [rec("ok", i, s, s + 5) for i, s in zip(intended, starts, strict=True)]
    s = summarize(INFO, records, Span(), Span(), slo=None)
    assert s.scheduled_rate == pytest.approx(50.0)
    assert s.sent_rate == pytest.approx(1000 / (20 + 100 * 49.5 / 83325))  # 49.85 req/s


def test_a_closed_loop_has_no_send_rate():
    """4 streams start together and each sends once more on its reply: the slope over their
    starts once read as 21,694 req/s (a tester's 4 starts within 0.2 ms). Only a rate stage
    sends on a schedule whose rate means anything."""
    starts = [0.0, 0.05, 0.1, 0.2, 100.0, 101.0, 102.0, 103.0]
    records = [rec("ok", s, s, s + 100) for s in starts]
    info = replace(INFO, label="concurrent@4", kind="concurrent", rate=4.0)
    s = summarize(info, records, Span(), Span(), slo=None)
    assert (s.sent_rate, s.scheduled_rate) == (None, None)
    assert s.request_throughput == pytest.approx(8 / 0.203)  # the stage's other rates stand


def test_warmup_drops_requests_started_before_it_from_the_latencies_only():
    s = summarize(INFO, [A, B, C, D], Span(seconds=0.05), Span(), slo={"ttft_ms": 150.0})
    assert s.window_start_ns == 50 * MS
    assert s.counts == {"ok": 1, "error": 1, "cancelled": 1}  # A started at 0: out
    assert s.metrics["ttft_ms"]["ok"].count == 1  # B's alone
    # but A ends at 135 ms, inside the 50..310 ms window: it counts as delivered there
    assert s.request_throughput == pytest.approx(2 / 0.26)
    assert s.output_token_throughput == pytest.approx(8 / 0.26)
    assert s.total_token_throughput == pytest.approx((8 + 30) / 0.26)
    assert s.goodput == pytest.approx(1 / 0.26)  # A (TTFT 100 ms) met the SLO; B (210) not
    assert s.slo_fraction == 0  # of B, C and D, begun in the window, none met it


def test_throughput_counts_the_tokens_that_arrived_inside_the_window():
    # window 105..310 ms: A's first chunk (100 ms) and its prompt fall before it, its other
    # three chunks inside; B started at 60 ms, before the window, and ends in it
    s = summarize(INFO, [A, B, C, D], Span(seconds=0.105), Span(), slo=None)
    assert s.counts == {"ok": 0, "error": 0, "cancelled": 1}  # only D began in the window
    assert s.request_throughput == pytest.approx(2 / 0.205)
    assert s.output_token_throughput == pytest.approx((3 + 4) / 0.205)
    assert s.total_token_throughput == pytest.approx((3 + 4 + 20) / 0.205)


def test_cooldown_as_a_fraction_of_the_stage():
    s = summarize(INFO, [A, B, C, D], Span(), Span(fraction=0.5), slo=None)
    assert s.window_end_ns == 155 * MS  # 310 ms stage, last half dropped
    assert s.counts == {"ok": 2, "error": 1, "cancelled": 1}  # all started before 155 ms
    assert s.request_throughput == pytest.approx(1 / 0.155)  # only A ended by then


def test_requests_the_benchmark_cut_do_not_stretch_the_window():
    # E hung until the drain's end cancelled it at 5 s; F hung until --request-timeout at
    # 2.2 s: neither end says anything about the server, so the window ends at B's 310 ms
    e = rec("cancelled", 100, 100, 5000)
    f = replace(rec("error", 200, 200, 2200), error="timeout after 2 s")
    s = summarize(INFO, [A, B, e, f], Span(), Span(), slo=None)
    assert (s.window_end_ns, s.end_ns) == (310 * MS, 5000 * MS)
    assert s.counts == {"ok": 2, "error": 1, "cancelled": 1}
    assert s.request_throughput == pytest.approx(2 / 0.31)
    assert s.output_token_throughput == pytest.approx(8 / 0.31)
    # a cut request sent after the last one that ended by itself still counts: the window
    # runs to its send at 400 ms
    late = rec("cancelled", 400, 400, 5000)
    s = summarize(INFO, [A, B, late], Span(), Span(), slo=None)
    assert s.window_end_ns == 400 * MS and s.counts["cancelled"] == 1
    assert s.request_throughput == pytest.approx(2 / 0.4)


def test_a_stage_where_no_request_finished_says_so_not_that_warmup_covers_it():
    for records in ([], [D], [rec("cancelled", 0, 0, 3000)]):  # no warmup, no cooldown
        s = summarize(INFO, records, Span(), Span(), slo=None)
        assert s.warnings == ["no request finished in the stage: it has no statistics"]
    s = summarize(INFO, [A, B], Span(seconds=10), Span(), slo=None)  # a warmup that does
    assert s.warnings == ["warmup + cooldown leave no request measured; statistics use the "
                          "whole stage"]


def test_a_stage_whose_requests_were_all_cut_ends_at_its_last_send():
    g = rec("cancelled", 0, 0, 3000)
    h = replace(rec("error", 50, 50, 2050), error="timeout after 2 s")
    s = summarize(INFO, [g, h, D], Span(), Span(), slo=None)  # D: scheduled at 120, never sent
    assert s.window_end_ns == 120 * MS
    assert s.counts == {"ok": 0, "error": 1, "cancelled": 2}
    assert s.request_throughput == 0


def test_slo_percentile_counts_failures_as_infinitely_slow():
    passed, observed = slo_percentile_check([A, B], {"ttft_ms": 205.0})
    assert passed and observed["ttft_ms"] == pytest.approx(204.5)  # 100 + 0.95 * 110
    passed, observed = slo_percentile_check([A, B, C, D], {"ttft_ms": 1e9})
    assert not passed and math.isinf(observed["ttft_ms"])


def test_timeline_bins():
    tl = build_timeline([A, B, C, D], end_ns=310 * MS)
    assert tl.bin_s == pytest.approx(0.1) and len(tl.t_s) == 4
    assert tl.output_tokens_per_s == pytest.approx([0, 40, 20, 20])
    assert tl.completed_per_s == pytest.approx([0, 10, 0, 10])  # A ends at 135, B at 310
    assert tl.errors_per_s == pytest.approx([0, 10, 0, 0])
    # bin 0: A 100 ms + B 40 ms busy; bin 1: A 35 + B 100 + C 50
    assert tl.concurrency[:2] == pytest.approx([1.4, 1.85])
